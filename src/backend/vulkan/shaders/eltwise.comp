// Element-wise ops over `count` elements (grid-stride loop); op selects:
//   0 add:          y += x
//   1 scale:        y *= a
//   2 sigmoid:      y = sigmoid(y)
//   3 mul_sigmoid:  y *= sigmoid(x)
//   4 situ:         y = SiTU(y, x) = beta tanh(y / beta) sigmoid(y) * (lambda > 0 ? lambda tanh(x / lambda) : x)
//   5 set_i32:      y = i (as int)
//   6 copy:         y = x
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
    }
  }
}
