// variants: MIX APPEND
// ResMix residual attention (k3-architecture §3.6), one workgroup per token:
//   MIX:    dst[t] = sum_k softmax(score)_k * entry_k over the nb bank entries and cur, where
//           score_k = (entry_k . w) / rms(entry_k) (bank_inv holds 1/rms of the bank entries)
//   APPEND: bank_entry = src, inv_entry[t] = 1 / sqrt(mean(src[t]^2) + eps)
#version 460
#include "common.glsl"

layout(local_size_x = 64) in;
layout(push_constant) uniform PC {
  uint64_t cur, w, bank, bank_inv, dst;
  uint nb, bank_tokens, n, d;
  float eps;
} pc;

shared float red[64];
shared float sc[256];

float reduce_sum(float v) {
  const uint tid = gl_LocalInvocationID.x;
  red[tid] = v;
  barrier();
  for (uint s = 32u; s > 0u; s >>= 1) {
    if (tid < s) red[tid] += red[tid + s];
    barrier();
  }
  float r = red[0];
  barrier();
  return r;
}

void main() {
  const uint t = gl_WorkGroupID.x, tid = gl_LocalInvocationID.x;
  const uint d = pc.d;
#if defined(VARIANT_APPEND)
  F32 s = F32(pc.cur + 4ul * uint64_t(t) * d);
  F32 o = F32(pc.bank + 4ul * uint64_t(t) * d);
  float ss = 0.0;
  for (uint i = tid; i < d; i += 64u) {
    float v = s.v[i];
    o.v[i] = v;
    ss += v * v;
  }
  ss = reduce_sum(ss);
  if (tid == 0u) F32(pc.bank_inv).v[t] = 1.0 / sqrt(ss / float(d) + pc.eps);
#else
  F32 c = F32(pc.cur + 4ul * uint64_t(t) * d);
  F32 o = F32(pc.dst + 4ul * uint64_t(t) * d);
  F32 w = F32(pc.w);
  if (pc.nb == 0u) {
    for (uint i = tid; i < d; i += 64u) o.v[i] = c.v[i];
    return;
  }
  for (uint k = 0u; k < pc.nb; ++k) {
    F32 b = F32(pc.bank + 4ul * (uint64_t(k) * pc.bank_tokens + t) * d);
    float s = 0.0;
    for (uint i = tid; i < d; i += 64u) s += b.v[i] * w.v[i];
    s = reduce_sum(s);
    if (tid == 0u) sc[k] = s * F32(pc.bank_inv).v[k * pc.bank_tokens + t];
  }
  float s = 0.0, ss = 0.0;
  for (uint i = tid; i < d; i += 64u) {
    s += c.v[i] * w.v[i];
    ss += c.v[i] * c.v[i];
  }
  s = reduce_sum(s);
  ss = reduce_sum(ss);
  if (tid == 0u) {
    sc[pc.nb] = s / sqrt(ss / float(d) + pc.eps);
    float mx = sc[0];
    for (uint k = 1u; k <= pc.nb; ++k) mx = max(mx, sc[k]);
    float sum = 0.0;
    for (uint k = 0u; k <= pc.nb; ++k) {
      sc[k] = exp(sc[k] - mx);
      sum += sc[k];
    }
    for (uint k = 0u; k <= pc.nb; ++k) sc[k] /= sum;
  }
  barrier();
  for (uint i = tid; i < d; i += 64u) {
    float acc = 0.0;
    for (uint k = 0u; k < pc.nb; ++k) acc += sc[k] * F32(pc.bank + 4ul * (uint64_t(k) * pc.bank_tokens + t) * d).v[i];
    o.v[i] = acc + sc[pc.nb] * c.v[i];
  }
#endif
}
