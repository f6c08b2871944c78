// variants: SPARSE DENSE
// MLA attention over the cached latent rows (absorbed form), one workgroup per (split, head,
// token). The rows a token visits form a list: SPARSE walks the selected list (sel_idx[t][0..
// sel_n[t]) or, when sel_n[t] < 0, positions 0..pos); DENSE walks every visible position 0..pos
// and gives unselected ones the score -inf (selection bitmask from mla_attn_mask.comp). The list
// is cut into chunks of CH rows; split s takes chunks s, s + splits, ... so a workgroup's cost is
// the rows it really visits (the grid does not depend on the context length).
// Per chunk: the rows' scores scale * q . row over the full row width W (8 threads per row on
// consecutive columns, their partials summed in a fixed order); the chunk max updates the
// running max m (online softmax: l and acc rescaled by exp(m_old - m)); then every thread adds
// p_j * row_j[d] for its own latent columns d (rows in chunk order).
// Windows: a dispatch covers w_count chunks of each split (the host issues several when one
// invocation's loops would run too long: lavapipe silently stops an invocation's loops after
// 65535 iterations in all); the state (m, l, acc[kvl]) of split s lives in
// part[(t * H + h) * splits + s] between windows. The last window writes z[t][h] = acc / l (0
// when no row was visited) when there is one split, else the state for mla_attn_combine.comp.
#version 460
#include "common.glsl"
#extension GL_EXT_control_flow_attributes : require

#define CH 64u
#define QMAX 2048u  // widest row (W)
#define ZMAX 16u    // latent columns per thread: kv_lora <= 64 * ZMAX

layout(local_size_x = 64) in;
layout(push_constant) uniform PC {
  uint64_t latent, qcat, sel_idx, sel_n, ents, part, mask, z;
  uint W, kvl, H, n, sel_cap, n_ctx, f16, splits, mask_words;
  float scale;
  uint w_first, w_count;  // this dispatch's window: chunks s + splits * (w_first + i), i < w_count
  uint load_state;        // 1: continue from the state in part (an earlier window)
  uint final_z;           // 1: write z (the last window, one split); else the state to part
  uint vec;               // 1: rows read 4 elements at a time (W, kv_lora multiples of 4, aligned rows)
} pc;

layout(buffer_reference, std430, buffer_reference_align = 8) buffer H4 { uvec2 v[]; };  // 4 halves
layout(buffer_reference, std430, buffer_reference_align = 16) buffer F4 { vec4 v[]; };

// the latent column of a thread's accumulator i: 64-strided, or 4 consecutive per thread (vec)
uint col(uint i) {
  const uint tid = gl_LocalInvocationID.x;
  return pc.vec != 0u ? 4u * tid + 256u * (i >> 2u) + (i & 3u) : tid + 64u * i;
}

shared float qs[QMAX];
shared float sc[CH];
shared float pp[CH];
shared uint ridx[CH];
shared float red[CH * 8u];  // partial dot products: 8 per row

#define NEG_INF uintBitsToFloat(0xFF800000u)
#define NONE 0xFFFFFFFFu

void main() {
  const uint tid = gl_LocalInvocationID.x, s = gl_WorkGroupID.x, h = gl_WorkGroupID.y;
  const uint64_t elt = pc.f16 != 0u ? 2ul : 4ul;
  const uint64_t row_bytes = uint64_t(pc.W) * elt;
  for (uint t = gl_WorkGroupID.z; t < pc.n; t += gl_NumWorkGroups.z) {
    const uint seq = uint(I32(pc.ents).v[t * 4u + 1u]), pos = uint(I32(pc.ents).v[t * 4u + 2u]);
    const int ns = I32(pc.sel_n).v[t];
#if defined(VARIANT_SPARSE)
    const uint nrows = ns < 0 ? pos + 1u : uint(ns);
    I32 sel = I32(pc.sel_idx + 4ul * uint64_t(t) * pc.sel_cap);
#else
    const uint nrows = pos + 1u;
    I32 bits = I32(pc.mask + 4ul * uint64_t(t) * pc.mask_words);
#endif
    const uint64_t base = pc.latent + uint64_t(seq) * pc.n_ctx * row_bytes;
    const uint64_t th = uint64_t(t) * pc.H + h;
    F32 st = F32(pc.part + 4ul * (th * pc.splits + s) * (pc.kvl + 2u));
    float m = NEG_INF, l = 0.0;
    float acc[ZMAX];
    [[unroll]] for (uint i = 0u; i < ZMAX; ++i) acc[i] = 0.0;
    if (pc.load_state != 0u) {
      m = st.v[0];
      l = st.v[1];
      [[unroll]] for (uint i = 0u; i < ZMAX; ++i) {
        const uint d = col(i);
        if (d < pc.kvl) acc[i] = st.v[2u + d];
      }
    }
    const uint first = (s + pc.splits * pc.w_first) * CH;  // uniform: the window's first row for this split
    if (first < nrows) {
      barrier();  // the previous token's readers of qs are done
      F32 q = F32(pc.qcat + 4ul * th * pc.W);
      for (uint i = tid; i < pc.W; i += 64u) qs[i] = q.v[i];
      uint c0 = first;
      for (uint wi = 0u; wi < pc.w_count && c0 < nrows; ++wi, c0 += pc.splits * CH) {
        barrier();  // qs written / the previous chunk's readers of sc, pp, ridx are done
        // 1. the cache row of list entry c0 + tid (NONE: past the list, unselected or out of range)
        const uint j = c0 + tid;
        uint r = NONE;
        if (j < nrows) {
#if defined(VARIANT_SPARSE)
          const int ri = ns < 0 ? int(j) : sel.v[j];
          if (ri >= 0 && uint(ri) <= pos) r = uint(ri);  // an index outside the visible rows is skipped
#else
          if (ns < 0 || ((uint(bits.v[j >> 5u]) >> (j & 31u)) & 1u) != 0u) r = j;
#endif
        }
        ridx[tid] = r;
        barrier();
        // 2. partial dot products: 8 threads per row (consecutive columns), 8 rows per group of 8
        const uint g = tid >> 3u, lane = tid & 7u;
        [[unroll]] for (uint rr = 0u; rr < CH / 8u; ++rr) {
          const uint jl = g + 8u * rr;
          const uint rj = ridx[jl];
          float part = 0.0;
          if (rj != NONE) {
            const uint64_t row = base + uint64_t(rj) * row_bytes;
            if (pc.vec != 0u && pc.f16 != 0u) {
              H4 rv = H4(row);
              for (uint v = lane; v < pc.W / 4u; v += 8u) {
                const uvec2 u = rv.v[v];
                const vec2 a = unpackHalf2x16(u.x), b = unpackHalf2x16(u.y);
                part += qs[4u * v] * a.x;
                part += qs[4u * v + 1u] * a.y;
                part += qs[4u * v + 2u] * b.x;
                part += qs[4u * v + 3u] * b.y;
              }
            } else if (pc.vec != 0u) {
              F4 rv = F4(row);
              for (uint v = lane; v < pc.W / 4u; v += 8u) {
                const vec4 a = rv.v[v];
                part += qs[4u * v] * a.x;
                part += qs[4u * v + 1u] * a.y;
                part += qs[4u * v + 2u] * a.z;
                part += qs[4u * v + 3u] * a.w;
              }
            } else if (pc.f16 != 0u) {
              U16 rv = U16(row);
              for (uint i = lane; i < pc.W; i += 8u) part += qs[i] * half_bits(uint(rv.v[i]));
            } else {
              F32 rv = F32(row);
              for (uint i = lane; i < pc.W; i += 8u) part += qs[i] * rv.v[i];
            }
          }
          red[jl * 8u + lane] = part;
        }
        barrier();
        // 3. the score of row tid: its 8 partials in lane order
        float sv = NEG_INF;
        if (r != NONE) {
          float a = 0.0;
          [[unroll]] for (uint k = 0u; k < 8u; ++k) a += red[tid * 8u + k];
          sv = a * pc.scale;
        }
        sc[tid] = sv;
        barrier();
        float bm = NEG_INF;
        [[unroll]] for (uint k = 0u; k < CH; ++k) bm = max(bm, sc[k]);
        if (bm == NEG_INF) continue;  // nothing visible in this chunk (uniform: every thread sees the same sc)
        if (bm > m) {
          const float c = m == NEG_INF ? 0.0 : exp(m - bm);
          l *= c;
          [[unroll]] for (uint i = 0u; i < ZMAX; ++i) acc[i] *= c;
          m = bm;
        }
        pp[tid] = sv == NEG_INF ? 0.0 : exp(sv - m);
        barrier();
        for (uint k = 0u; k < CH; ++k) {
          const float p = pp[k];
          if (p == 0.0) continue;
          l += p;
          const uint64_t row = base + uint64_t(ridx[k]) * row_bytes;
          if (pc.vec != 0u && pc.f16 != 0u) {
            H4 rv = H4(row);
            [[unroll]] for (uint g4 = 0u; g4 < ZMAX / 4u; ++g4) {
              const uint c = tid + 64u * g4;  // columns 4c .. 4c + 3 = col(4 g4 .. 4 g4 + 3)
              if (4u * c < pc.kvl) {
                const uvec2 u = rv.v[c];
                const vec2 a = unpackHalf2x16(u.x), b = unpackHalf2x16(u.y);
                acc[4u * g4] += p * a.x;
                acc[4u * g4 + 1u] += p * a.y;
                acc[4u * g4 + 2u] += p * b.x;
                acc[4u * g4 + 3u] += p * b.y;
              }
            }
          } else if (pc.vec != 0u) {
            F4 rv = F4(row);
            [[unroll]] for (uint g4 = 0u; g4 < ZMAX / 4u; ++g4) {
              const uint c = tid + 64u * g4;
              if (4u * c < pc.kvl) {
                const vec4 a = rv.v[c];
                acc[4u * g4] += p * a.x;
                acc[4u * g4 + 1u] += p * a.y;
                acc[4u * g4 + 2u] += p * a.z;
                acc[4u * g4 + 3u] += p * a.w;
              }
            }
          } else if (pc.f16 != 0u) {
            U16 rv = U16(row);
            [[unroll]] for (uint i = 0u; i < ZMAX; ++i) {
              const uint d = col(i);
              if (d < pc.kvl) acc[i] += p * half_bits(uint(rv.v[d]));
            }
          } else {
            F32 rv = F32(row);
            [[unroll]] for (uint i = 0u; i < ZMAX; ++i) {
              const uint d = col(i);
              if (d < pc.kvl) acc[i] += p * rv.v[d];
            }
          }
        }
      }
    }
    if (pc.final_z != 0u) {
      const float inv = l > 0.0 ? 1.0 / l : 0.0;
      F32 z = F32(pc.z + 4ul * th * pc.kvl);
      [[unroll]] for (uint i = 0u; i < ZMAX; ++i) {
        const uint d = col(i);
        if (d < pc.kvl) z.v[d] = acc[i] * inv;
      }
    } else {
      barrier();  // every thread has read the old state (load_state) before thread 0 overwrites m, l
      if (tid == 0u) {
        st.v[0] = m;
        st.v[1] = l;
      }
      [[unroll]] for (uint i = 0u; i < ZMAX; ++i) {
        const uint d = col(i);
        if (d < pc.kvl) st.v[2u + d] = acc[i];
      }
    }
  }
}
