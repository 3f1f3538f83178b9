// --device / LoadOptions::device (issue 29): parsing, and the errors on a machine or build that
// cannot run CUDA. Runs in every build; each case asserts what this build and machine must say.
#include "kvboost/gpu.h"
#include "testing/fixture.h"
#include "test_util.h"
#include "error_of.h"

using namespace kvboost;
using kernels::Device;

using kvboost::test::error_of;

TEST(Device, ParsesCpuCudaAndCudaN) {
  EXPECT_TRUE(kernels::parse_device("cpu").is_cpu());
  EXPECT_EQ(kernels::parse_device("cuda"), (Device{Device::Kind::Cuda, 0}));
  EXPECT_EQ(kernels::parse_device("cuda:0"), (Device{Device::Kind::Cuda, 0}));
  EXPECT_EQ(kernels::parse_device("cuda:1"), (Device{Device::Kind::Cuda, 1}));
  EXPECT_EQ(kernels::parse_device("cuda:12").name(), "cuda:12");
  EXPECT_EQ(Device{}.name(), "cpu");
  EXPECT_TRUE(LoadOptions{}.device.is_cpu());  // the default stays the CPU
}

TEST(Device, BadValuesNameTheValue) {
  for (const char* bad : {"", "gpu", "CUDA", "cuda:", "cuda:-1", "cuda:+1", "cuda:1x", "cuda:x", "cuda 0",
                          "cuda:99999999999", "cpu:0"}) {
    const std::string e = error_of([&] { kernels::parse_device(bad, "--device"); });
    EXPECT_NE(e.find(std::string("--device: \"") + bad + "\" is not a device (cpu, cuda, cuda:N"), std::string::npos)
        << bad << ": " << e;
  }
}

TEST(Device, CpuIsAlwaysUsable) {
  EXPECT_EQ(error_of([] { kernels::require_device(Device{}); }), "");
}

TEST(Device, CudaErrorsSayWhy) {
  EXPECT_EQ(kernels::cuda_built(), gpu::built_with_cuda());
  const Device c1{Device::Kind::Cuda, 1};
  const std::string e = error_of([&] { kernels::require_device(c1, "--device"); });
  if (!kernels::cuda_built()) {
    EXPECT_EQ(kernels::cuda_device_count(), 0);
    EXPECT_EQ(e, "--device cuda:1: kvboost was built without CUDA (-DKVBOOST_CUDA=ON)");
    return;
  }
  const int n = kernels::cuda_device_count();
  if (n == 0) {
    EXPECT_NE(e.find("--device cuda:1: no CUDA device (CUDA sees 0 devices"), std::string::npos) << e;
  } else if (n == 1) {
    EXPECT_EQ(e, "--device cuda:1: CUDA sees 1 device (cuda:0 .. cuda:0)");
  } else {
    EXPECT_EQ(e, "");
  }
  const Device past{Device::Kind::Cuda, n};
  EXPECT_NE(error_of([&] { kernels::require_device(past); }), "");
}

// Model::load checks the device before it reads a file: the error names the device, not the
// (missing) model directory.
TEST(Device, ModelLoadChecksTheDevice) {
  LoadOptions o;
  o.device = Device{Device::Kind::Cuda, 0};
  const std::string e = error_of([&] { Model::load("/nonexistent_model_dir", o); });
  EXPECT_NE(e.find("device cuda:0: "), std::string::npos) << e;
  EXPECT_EQ(e.find("/nonexistent_model_dir"), std::string::npos) << e;
  if (!kernels::cuda_built()) {
    EXPECT_NE(e.find("built without CUDA (-DKVBOOST_CUDA=ON)"), std::string::npos) << e;
  }
  // and the CPU default loads
  const std::string dir = test::make_temp_dir("device_cpu_load");
  FixtureSpec s = fixture_preset("tiny");
  s.tokenizer_kind = "";
  write_fixture_model(dir, s);
  LoadOptions cpu;
  cpu.device = kernels::parse_device("cpu");
  EXPECT_NE(Model::load(dir, cpu), nullptr);
}
