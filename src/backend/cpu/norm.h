#pragma once
// RMSNorm as the reference's: statistics in fp32, output rounded to bf16.
#include <cstdint>

#include "model/weight.h"

namespace dsv41 {

// y = bf16(weight * (x * rsqrt(mean(x²) + eps))) for each of `rows` rows of `dim`. `weight` is a
// [dim] vector (a Weight with rows = 1), or nullptr for an unweighted norm.
void rms_norm(const float* x, int64_t rows, int64_t dim, const Weight* weight, float eps, float* y);

// rsqrt(mean(x²) + eps) of one vector, in fp32: the statistic every norm of the model shares.
float rms_inverse(const float* x, int64_t n, float eps);

}  // namespace dsv41
