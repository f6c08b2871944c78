// KDA short convolution + SiLU (vk_kda.cpp kda_conv_silu), one invocation per channel of the three
// streams (q, k, v), tokens in batch order. Each sequence's rolling state holds the last K - 1
// pre-conv inputs of every channel, oldest first: stream `which`, channel c at
//   state + seq * per_seq + which * C * (K - 1) + c * (K - 1).
//   acc = sum_j<K-1 w[c][j] * st[j] + w[c][K-1] * u;  st <- (st[1..], u);  x[t][c] = silu(acc)
// ents: the micro-batch as 4 ints per token (token, seq_id, pos, flags).
#version 460
#include "common.glsl"

layout(local_size_x = 64) in;
layout(push_constant) uniform PC {
  uint64_t w0, w1, w2, x0, x1, x2;
  uint64_t state, ents, per_seq;
  uint K, C, n;
} pc;

void main() {
  const uint total = 3u * pc.C;
  const uint S = pc.K - 1u;
  I32 ents = I32(pc.ents);
  for (uint gid = gl_GlobalInvocationID.x; gid < total; gid += gl_NumWorkGroups.x * 64u) {
    const uint which = gid / pc.C, c = gid - which * pc.C;
    const uint64_t wa = which == 0u ? pc.w0 : (which == 1u ? pc.w1 : pc.w2);
    const uint64_t xa = which == 0u ? pc.x0 : (which == 1u ? pc.x1 : pc.x2);
    F32 wc = F32(wa + 4ul * uint64_t(c) * pc.K);
    const uint64_t st_off = uint64_t(which) * pc.C * S + uint64_t(c) * S;
    for (uint t = 0u; t < pc.n; ++t) {
      const uint seq = uint(ents.v[t * 4u + 1u]);
      F32 st = F32(pc.state + 4ul * (uint64_t(seq) * pc.per_seq + st_off));
      F32 u = F32(xa + 4ul * (uint64_t(t) * pc.C + c));
      const float ut = u.v[0];
      float acc = 0.0;
      for (uint j = 0u; j < S; ++j) acc += wc.v[j] * st.v[j];
      acc += wc.v[S] * ut;
      for (uint j = 0u; j + 1u < S; ++j) st.v[j] = st.v[j + 1u];
      if (S > 0u) st.v[S - 1u] = ut;
      u.v[0] = acc / (1.0 + exp(-acc));
    }
  }
}
