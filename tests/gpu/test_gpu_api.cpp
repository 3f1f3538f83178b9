// kvboost/gpu.h in every build: without CUDA each call answers the "built without CUDA" Error;
// with CUDA and no device, creating a decoder says that no device is visible.
#include "kvboost/gpu.h"
#include "testing/fixture.h"
#include "test_util.h"
#include "error_of.h"

using namespace kvboost;

using kvboost::test::error_of;

namespace {
std::unique_ptr<Model> tiny_model(const std::string& name) {
  const std::string dir = test::make_temp_dir(name);
  FixtureSpec s = fixture_preset("tiny");
  s.tokenizer_kind = "";
  write_fixture_model(dir, s);
  return Model::load(dir);
}

}  // namespace

TEST(GpuApi, WithoutCudaEveryCallSaysSo) {
  if (gpu::built_with_cuda()) GTEST_SKIP() << "built with CUDA";
  EXPECT_EQ(gpu::device_count(), 0);
  auto m = tiny_model("gpu_api_nocuda");
  const std::string want = "built without CUDA (-DKVBOOST_CUDA=ON)";
  EXPECT_NE(error_of([&] { gpu::Decoder::create(*m); }).find(want), std::string::npos);
  EXPECT_NE(error_of([&] { gpu::device_info(0); }).find(want), std::string::npos);
  EXPECT_NE(error_of([&] { gpu::pinned_h2d_gbps(1 << 20); }).find(want), std::string::npos);
}

TEST(GpuApi, WithCudaButNoDeviceCreateSaysSo) {
  if (!gpu::built_with_cuda()) GTEST_SKIP() << "built without CUDA";
  if (gpu::device_count() > 0) GTEST_SKIP() << "a CUDA device is present (this case checks the no-device error)";
  auto m = tiny_model("gpu_api_nodev");
  EXPECT_NE(error_of([&] { gpu::Decoder::create(*m); }).find("no CUDA device"), std::string::npos);
}

TEST(GpuApi, BadOptionsAreRejected) {
  if (gpu::device_count() == 0) GTEST_SKIP() << "no CUDA device (GPU tests always skip on a machine without a CUDA device, as in CI: they run only where scripts/gpu_check.sh runs them)";
  auto m = tiny_model("gpu_api_opts");
  gpu::DecoderOptions o;
  o.stream_slots = 1;
  EXPECT_NE(error_of([&] { gpu::Decoder::create(*m, o); }).find("stream_slots = 1"), std::string::npos);
  o.stream_slots = 0;
  o.max_tokens = 8;
  auto d = gpu::Decoder::create(*m, o);
  std::vector<int32_t> toks(9, 1);
  std::vector<float> logits(size_t(m->config().vocab_size));
  EXPECT_NE(error_of([&] { d->forward(toks.data(), 9, logits.data()); }).find("capacity"), std::string::npos);
  toks[0] = int32_t(m->config().vocab_size);
  EXPECT_NE(error_of([&] { d->forward(toks.data(), 1, logits.data()); }).find("outside the vocabulary"),
            std::string::npos);
  EXPECT_EQ(d->size(), 0);
}
