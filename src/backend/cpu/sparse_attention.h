#pragma once
// Sparse attention with a sink (kernel.py sparse_attn): one query head set against a gathered list
// of shared K=V entries — the sliding window and the selected compressed entries — under one
// softmax, with exp(sink_h) added to each head's denominator.
#include <cstdint>
#include <vector>

namespace dsv41 {

// For one query position: q [heads, d]; entries[j] points at a d-vector (bf16 values) or is null for
// an empty slot (the reference's index -1). The order of `entries` matters to the last bit: the
// softmax runs online over blocks of 64 entries with the probabilities rounded to bf16 against the
// running maximum, as the reference kernel does. out [heads, d], rounded to bf16.
void sparse_attention(const float* q, int heads, int d, const std::vector<const float*>& entries, const float* sink,
                      float scale, float* out);

}  // namespace dsv41
