// kvboost/runtime.h — the runtime module's umbrella header: kvboost/engine.h (Engine,
// GenerateOptions, GenerateResult, Request), kvboost/sampler.h (Sampler, logprobs, stop
// strings), kvboost/sampling.h (SamplingParams), and kvboost/reuse.h (chunk reuse's policy,
// plan and adaptive guard: the reuse module, which the engine uses).
#pragma once

#include "kvboost/engine.h"
#include "kvboost/reuse.h"
#include "kvboost/sampler.h"
#include "kvboost/sampling.h"
