// KDA decay gate in log space (vk_kda.cpp kda_gate), element-wise over n tokens x H heads x D:
//   a = g + dt_bias;  ea = -ssm_a[h] (= exp(A_log) > 0)
//   lower bound lb:  g = lb / (1 + exp(-ea * a))          (lb * sigmoid(ea * a))
//   none:            g = -ea * softplus(a), softplus(a) = a > 20 ? a : log1p(exp(a))
#version 460
#include "common.glsl"

layout(local_size_x = 256) in;
layout(push_constant) uniform PC {
  uint64_t g, dtb, a;
  uint count, C, D, has_lb;
  float lb;
} pc;

// log(1 + y) without losing y when it is small next to 1 (GLSL has no log1p): the rounding of
// u = 1 + y is undone by the ratio y / (u - 1)
float log1p_exact(float y) {
  precise float u = 1.0 + y;
  precise float d = u - 1.0;
  if (d == 0.0) return y;
  return log(u) * (y / d);
}

void main() {
  F32 g = F32(pc.g);
  F32 dtb = F32(pc.dtb);
  F32 sa = F32(pc.a);
  for (uint idx = gl_GlobalInvocationID.x; idx < pc.count; idx += gl_NumWorkGroups.x * 256u) {
    const uint ch = idx % pc.C;
    const float ea = -sa.v[ch / pc.D];
    const float x = g.v[idx] + dtb.v[ch];
    if (pc.has_lb != 0u) {
      g.v[idx] = pc.lb / (1.0 + exp(-ea * x));
    } else {
      const float sp = x > 20.0 ? x : log1p_exact(exp(x));
      g.v[idx] = -ea * sp;
    }
  }
}
