#pragma once
// Choosing tokens on the device: the CPU's choose() (backend/cpu/sampling.h) for many rows of
// logits at once, so that a step copies back a token per row (and its logprobs), not the row.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>
#include <vector>

#include "model/sampling.h"

namespace dsv41::cuda {

// Request i chooses from the logits row rows[i] of `logits` (device, rows `stride` floats apart):
// the same candidates in the same order as the CPU's choice (descending logit, ties by the lower
// id), the same filters and the same walk to u × their mass; only the fp64 sums of the
// probabilities run in another order, so a token differs from the CPU's only where u falls within
// that rounding of a boundary between two candidates. Logits are finite (a NaN may win the argmax
// here, never on the CPU), and -0.0 sorts after +0.0 here where the CPU ties them by id.
// The requests' logit edits (logit_bias, penalties) are applied to their rows first, in place:
// the edited rows are what the choice and its logprobs see, as on the CPU (the same fp32 steps).
// Then a request's mask (SampleRequest::allowed) sets its disallowed tokens' logits to -inf.
std::vector<TokenChoice> choose(float* logits, int64_t stride, std::span<const int64_t> rows,
                                std::span<const SampleRequest> requests, cudaStream_t stream);

}  // namespace dsv41::cuda
