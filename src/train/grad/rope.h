#pragma once
// Rotary position embedding in the reference's partial layout (model.py apply_rotary_emb on
// x[..., -rope_head_dim:]): in each head of head_dim values, the last rope_dim are rotated as
// interleaved pairs (2i, 2i+1) by angle pos · freq_i; the first head_dim − rope_dim pass through.
// `inverse` rotates by −angle (the attention output's de-rotation).
//
// The frequencies are backend/cpu's RopeTable's (fp32, YaRN applied), and the angle is their fp32
// product with the position, as RopeTable::apply forms it, so a position rotates by the same angle in
// training and in serving however long the context; only the rotation itself runs in T.
//
// A rotation is orthogonal, so the backward is the opposite rotation of the output's gradient.
#include <cmath>
#include <cstdint>

namespace dsv41::grad {

// x [rows, heads, head_dim] in place; positions [rows]; freqs [rope_dim / 2].
template <class T>
void rope_forward(T* x, int64_t rows, int64_t heads, int64_t head_dim, int64_t rope_dim, const int64_t* positions,
                  const float* freqs, bool inverse) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < rope_dim / 2; ++i) {
      const float angle = float(positions[r]) * freqs[i];
      const T c = std::cos(T(angle)), s = inverse ? -std::sin(T(angle)) : std::sin(T(angle));
      for (int64_t h = 0; h < heads; ++h) {
        T* pair = x + (r * heads + h) * head_dim + head_dim - rope_dim + 2 * i;
        const T a = pair[0], b = pair[1];
        pair[0] = a * c - b * s;
        pair[1] = a * s + b * c;
      }
    }
}

// dx [rows, heads, head_dim] in place: the output's gradient becomes the input's. A rotated tensor
// feeds nothing else, so the gradient is turned where it lies rather than added.
template <class T>
void rope_backward(T* dx, int64_t rows, int64_t heads, int64_t head_dim, int64_t rope_dim, const int64_t* positions,
                   const float* freqs, bool inverse) {
  rope_forward(dx, rows, heads, head_dim, rope_dim, positions, freqs, !inverse);
}

}  // namespace dsv41::grad
