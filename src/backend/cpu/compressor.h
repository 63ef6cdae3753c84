#pragma once
// CSA2's compressor pooling (model.py Compressor, ratio > 1): m consecutive tokens' KV rows pooled
// into one latent with a per-channel softmax over their gate scores.
namespace dsv41 {

// out[c] = Σ_t softmax_t(score[t][c]) · kv[t][c] over the m rows of a group, in fp32.
void pool_group(const float* kv, const float* score, int m, int d, float* out);

}  // namespace dsv41
