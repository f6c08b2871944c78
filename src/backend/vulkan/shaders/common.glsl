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
