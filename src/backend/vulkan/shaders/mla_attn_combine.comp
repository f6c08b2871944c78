// The split partials of mla_attn.comp merged into z, one workgroup per (head, token):
//   M = max_s m_s, w_s = exp(m_s - M) (0 for a split that visited no row), L = sum_s w_s l_s,
//   z[t][h][d] = (sum_s w_s acc_s[d]) / L   (0 when L = 0: no row visited)
#version 460
#include "common.glsl"

layout(local_size_x = 64) in;
layout(push_constant) uniform PC {
  uint64_t part, z;
  uint kvl, H, n, splits;
} pc;

#define NEG_INF uintBitsToFloat(0xFF800000u)

void main() {
  const uint tid = gl_LocalInvocationID.x, h = gl_WorkGroupID.x;
  const uint stride = pc.kvl + 2u;
  for (uint t = gl_WorkGroupID.y; t < pc.n; t += gl_NumWorkGroups.y) {
    const uint64_t th = uint64_t(t) * pc.H + h;
    F32 p = F32(pc.part + 4ul * th * pc.splits * stride);
    float M = NEG_INF;
    for (uint s = 0u; s < pc.splits; ++s) M = max(M, p.v[s * stride]);
    float L = 0.0;
    for (uint s = 0u; s < pc.splits; ++s) {
      const float m = p.v[s * stride];
      L += m == NEG_INF ? 0.0 : exp(m - M) * p.v[s * stride + 1u];
    }
    const float inv = L > 0.0 ? 1.0 / L : 0.0;
    F32 z = F32(pc.z + 4ul * th * pc.kvl);
    for (uint d = tid; d < pc.kvl; d += 64u) {
      float a = 0.0;
      for (uint s = 0u; s < pc.splits; ++s) {
        const float m = p.v[s * stride];
        if (m != NEG_INF) a += exp(m - M) * p.v[s * stride + 2u + d];
      }
      z.v[d] = a * inv;
    }
  }
}
