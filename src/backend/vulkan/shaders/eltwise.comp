// Element-wise ops over `count` elements (grid-stride loop); op selects:
//   0 add:          y += x
//   1 scale:        y *= a
//   2 sigmoid:      y = sigmoid(y)
//   3 mul_sigmoid:  y *= sigmoid(x)
//   4 situ:         y = SiTU(y, x) = beta tanh(y / beta) sigmoid(y) * (lambda > 0 ? lambda tanh(x / lambda) : x)
//   5 set_i32:      y = i (as int)
//   6 copy:         y = x
//   7 silu_mul:     y = silu(y) * x = y / (1 + exp(-y)) * x   (the DSpark draft's SwiGLU)
//   8 gelu_tanh:    y = 0.5 y (1 + tanh(sqrt(2/pi) (y + 0.044715 y^3)))
//   9 gelu_erf:     y = 0.5 y (1 + erf(y / sqrt 2))
#version 460
#include "common.glsl"

layout(local_size_x = 256) in;
layout(push_constant) uniform PC {
  uint64_t y, x;
  uint count;
  uint op;
  float a, b;
  int i;
} pc;

void main() {
  const uint stride = gl_NumWorkGroups.x * 256u;
  F32 y = F32(pc.y);
  F32 x = F32(pc.x);
  for (uint k = gl_GlobalInvocationID.x; k < pc.count; k += stride) {
    switch (pc.op) {
      case 0u: y.v[k] += x.v[k]; break;
      case 1u: y.v[k] *= pc.a; break;
      case 2u: y.v[k] = sigmoid(y.v[k]); break;
      case 3u: y.v[k] *= sigmoid(x.v[k]); break;
      case 4u: {
        float g = y.v[k], u = x.v[k];
        float act = pc.a * tanh_safe(g / pc.a) * sigmoid(g);
        y.v[k] = act * (pc.b > 0.0 ? pc.b * tanh_safe(u / pc.b) : u);
        break;
      }
      case 5u: I32(pc.y).v[k] = pc.i; break;
      case 6u: y.v[k] = x.v[k]; break;
      case 7u: {
        float g = y.v[k];
        y.v[k] = g / (1.0 + exp(-g)) * x.v[k];
        break;
      }
      case 8u: {
        float g = y.v[k];
        y.v[k] = 0.5 * g * (1.0 + tanh_safe(0.7978845608028654 * (g + 0.044715 * g * g * g)));
        break;
      }
      case 9u: {
        float g = y.v[k];
        y.v[k] = 0.5 * g * (1.0 + erf_f32(g * 0.7071067811865476));
        break;
      }
    }
  }
}
