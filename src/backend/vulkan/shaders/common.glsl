// Shared declarations of the Vulkan backend's compute shaders. Every buffer is reached through its
// device address (GL_EXT_buffer_reference): push constants carry uint64 addresses, no descriptors.
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_buffer_reference2 : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
#extension GL_EXT_shader_explicit_arithmetic_types_int8 : require
#extension GL_EXT_shader_explicit_arithmetic_types_int16 : require
#extension GL_EXT_shader_8bit_storage : require
#extension GL_EXT_shader_16bit_storage : require

layout(buffer_reference, std430, buffer_reference_align = 4) buffer F32 { float v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) buffer I32 { int v[]; };
layout(buffer_reference, std430, buffer_reference_align = 2) buffer U16 { uint16_t v[]; };
layout(buffer_reference, std430, buffer_reference_align = 1) buffer U8 { uint8_t v[]; };

// the i-th f32 / i32 / u16 / u8 element at a device address
#define F32AT(a) F32(a).v
#define I32AT(a) I32(a).v

float f16_at(uint64_t a) { return unpackHalf2x16(uint(U16(a).v[0])).x; }
float half_bits(uint h) { return unpackHalf2x16(h).x; }

// tanh without overflow for large |x| (some drivers compute tanh through exp(2x))
float tanh_safe(float x) {
  float t = exp(-2.0 * abs(x));
  float r = (1.0 - t) / (1.0 + t);
  return x < 0.0 ? -r : r;
}
float sigmoid(float x) { return 1.0 / (1.0 + exp(-x)); }

// erf (GLSL has none): erf(x) = 1 - erfc(x) with erfc from the Chebyshev-fitted exponential form
// (Numerical Recipes' erfcc, fractional error below 1.2e-7 everywhere); for |x| < 0.5 a Taylor
// series (odd powers to x^13, error below 1e-9), where 1 - erfc would cancel
float erf_f32(float x) {
  float a = abs(x);
  if (a < 0.5) {
    float x2 = x * x;
    // 2/sqrt(pi) * (x - x^3/3 + x^5/10 - x^7/42 + x^9/216 - x^11/1320 + x^13/9360)
    float p = 1.0 / 9360.0;
    p = p * x2 - 1.0 / 1320.0;
    p = p * x2 + 1.0 / 216.0;
    p = p * x2 - 1.0 / 42.0;
    p = p * x2 + 1.0 / 10.0;
    p = p * x2 - 1.0 / 3.0;
    p = p * x2 + 1.0;
    return 1.1283791670955126 * x * p;
  }
  float t = 1.0 / (1.0 + 0.5 * a);
  float e = t * exp(-a * a - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 +
            t * (-0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 +
            t * (-0.82215223 + t * 0.17087277)))))))));
  float r = 1.0 - e;
  return x < 0.0 ? -r : r;
}
