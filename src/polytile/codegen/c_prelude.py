"""The C prelude every generated source starts with: the vector types, vector exp/exp2,
lane masks, the register-pinning macro and the scalar helpers (integer division and modulo
as Python's, bfloat16 conversions, erfinv) that the renderer's op templates (``codegen.c``)
call."""
from __future__ import annotations

_PRELUDE_HEAD = r"""#include <stdint.h>
#include <stdbool.h>
#include <math.h>
typedef float pt_f32x4 __attribute__((vector_size(16), aligned(4)));
typedef float pt_f32x8 __attribute__((vector_size(32), aligned(4)));
typedef float pt_f32x16 __attribute__((vector_size(64), aligned(4)));
typedef int32_t pt_i32x4 __attribute__((vector_size(16)));
typedef int32_t pt_i32x8 __attribute__((vector_size(32)));
typedef int32_t pt_i32x16 __attribute__((vector_size(64)));
#ifdef PT_LIBMVEC
/* glibc's vector math library has SIMD variants of these: loops calling them vectorize */
#define PT_SIMD __attribute__((simd("notinbranch")))
float expf(float) PT_SIMD; float logf(float) PT_SIMD; float log1pf(float) PT_SIMD; float expm1f(float) PT_SIMD;
float sinf(float) PT_SIMD; float cosf(float) PT_SIMD; float tanf(float) PT_SIMD; float tanhf(float) PT_SIMD;
float erff(float) PT_SIMD; float asinf(float) PT_SIMD; float acosf(float) PT_SIMD; float atanf(float) PT_SIMD;
float sinhf(float) PT_SIMD; float coshf(float) PT_SIMD; float exp2f(float) PT_SIMD; float log2f(float) PT_SIMD;
float log10f(float) PT_SIMD; float powf(float, float) PT_SIMD; float atan2f(float, float) PT_SIMD;
#endif
"""

# the end of the portable vector exp and exp2: p times 2^n built in the exponent bits (n = ni),
# 0 below the range (lo), inf above it (hi), NaN kept
_TIMES_2N = r"""  pt_i32x{n} top = ni > 127;  /* 2^128 is not a float: scale by 2^127, then by 2 */
  pt_f32x{n} y = p * (pt_f32x{n})((ni + top + 127) << 23);
  y = pt_sel_f32x{n}(top, y + y, y);
  y = pt_sel_f32x{n}(lo, (pt_f32x{n}){{}}, y);
  y = pt_sel_f32x{n}(hi, (pt_f32x{n}){{}} + INFINITY, y);
  return pt_sel_f32x{n}(nan, x, y); }}
"""
# vector exp, one per vector width: Cody-Waite reduction to r in [-ln2/2, ln2/2], a degree-6
# polynomial (Cephes expf's), times 2^n built in the exponent bits
_VECTOR_EXP = r"""static inline pt_f32x{n} pt_sel_f32x{n}(pt_i32x{n} m, pt_f32x{n} a, pt_f32x{n} b) {{
  return (pt_f32x{n})(((pt_i32x{n})a & m) | ((pt_i32x{n})b & ~m)); }}
static inline pt_f32x{n} pt_exp_f32x{n}(pt_f32x{n} x) {{
  /* max relative error 3e-7 (5 ulp); 0 below -87.33, inf above 88.72, NaN kept */
  pt_i32x{n} lo = x < -87.33f, hi = x > 88.72f, nan = x != x;
  pt_f32x{n} xc = pt_sel_f32x{n}(lo, (pt_f32x{n}){{}} - 87.33f, pt_sel_f32x{n}(hi, (pt_f32x{n}){{}} + 88.72f, x));
  pt_f32x{n} t = xc * 1.44269504088896341f;
  pt_f32x{n} half = (pt_f32x{n})(((pt_i32x{n})t & (int32_t)0x80000000) | 0x3f000000);
  pt_i32x{n} ni = __builtin_convertvector(t + half, pt_i32x{n});
  pt_f32x{n} nf = __builtin_convertvector(ni, pt_f32x{n});
  pt_f32x{n} r = xc - nf * 0.693359375f;
  r = r - nf * -2.12194440e-4f;
  pt_f32x{n} p = r * 1.9875691500E-4f + 1.3981999507E-3f;
  p = p * r + 8.3334519073E-3f; p = p * r + 4.1665795894E-2f; p = p * r + 1.6666665459E-1f;
  p = p * r + 5.0000001201E-1f;
  p = p * (r * r) + r + 1.0f;
""" + _TIMES_2N
_PRELUDE_TAIL = r"""static inline float pt_bf16_f32(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; __builtin_memcpy(&f, &u, 4); return f; }
/* f32 -> bf16 rounded to nearest even, NaN -> the canonical 0x7fc0. The NaN test is integer
   arithmetic, no compare and no branch: gcc vectorizes loops that use it, even beside a
   float compare (a compare-and-select here next to a NaN-propagating max stops it) */
static inline uint32_t pt_bf16_bits(float f) {
  uint32_t u; __builtin_memcpy(&u, &f, 4); uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  uint32_t nan = 0u - ((0x7f800000u - (u & 0x7fffffffu)) >> 31);
  return (r & ~nan) | (0x7fc00000u & nan); }
static inline uint16_t pt_f32_bf16(float f) { return (uint16_t)(pt_bf16_bits(f) >> 16); }
static inline float pt_round_bf16(float f) {  /* pt_bf16_f32(pt_f32_bf16(f)), in 32-bit lanes */
  uint32_t r = pt_bf16_bits(f); float o; __builtin_memcpy(&o, &r, 4); return o; }
static inline int64_t pt_floordiv_i(int64_t a, int64_t b) { if (b == 0) return 0; int64_t q = a / b; return (q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q; }
static inline int64_t pt_mod_i(int64_t a, int64_t b) { if (b == 0) return 0; int64_t r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
static inline int64_t pt_truncdiv_i(int64_t a, int64_t b) { return b == 0 ? 0 : a / b; }
static inline int64_t pt_pow_i(int64_t a, int64_t e) { int64_t r = 1; if (e < 0) return a == 1 ? 1 : (a == -1 ? ((e & 1) ? -1 : 1) : 0); while (e) { if (e & 1) r *= a; a *= a; e >>= 1; } return r; }
static inline float pt_mod_f(float a, float b) { float r = fmodf(a, b); return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
static inline double pt_mod_d(double a, double b) { double r = fmod(a, b); return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
static inline double pt_opaque_d(double x) { __asm__("" : "+x"(x)); return x; }
static inline float pt_erfinv_f(float y) {
  /* Newton iterations on erf from a rational first guess (Giles' approximation). */
  if (y == -1.0f) return -INFINITY; if (y == 1.0f) return INFINITY;
  if (!(y > -1.0f && y < 1.0f)) return NAN;  /* outside the domain, and NaN */
  double w = -log((1.0 - y) * (1.0 + y)), x;
  if (w < 5.0) { w -= 2.5; x = 2.81022636e-08; x = 3.43273939e-07 + x*w; x = -3.5233877e-06 + x*w; x = -4.39150654e-06 + x*w; x = 0.00021858087 + x*w; x = -0.00125372503 + x*w; x = -0.00417768164 + x*w; x = 0.246640727 + x*w; x = 1.50140941 + x*w; }
  else { w = sqrt(w) - 3.0; x = -0.000200214257; x = 0.000100950558 + x*w; x = 0.00134934322 + x*w; x = -0.00367342844 + x*w; x = 0.00573950773 + x*w; x = -0.0076224613 + x*w; x = 0.00943887047 + x*w; x = 1.00167406 + x*w; x = 2.83297682 + x*w; }
  x *= y; for (int i = 0; i < 2; ++i) x -= (erf(x) - y) / (1.1283791670955126 * exp(-x * x));
  return (float)x;
}
"""
# vector 2^x: r = x - round(x) is exact (no Cody-Waite step), a degree-6 Taylor polynomial of
# 2^r on [-1/2, 1/2], times 2^n built in the exponent bits, the ends as pt_exp's
_VECTOR_EXP2 = r"""static inline pt_f32x{n} pt_exp2_f32x{n}(pt_f32x{n} x) {{
  /* max relative error 3e-7; 0 below -126, inf above 128, NaN kept */
  pt_i32x{n} lo = x < -126.0f, hi = x > 128.0f, nan = x != x;
  pt_f32x{n} xc = pt_sel_f32x{n}(lo, (pt_f32x{n}){{}} - 126.0f, pt_sel_f32x{n}(hi, (pt_f32x{n}){{}} + 128.0f, x));
  pt_f32x{n} half = (pt_f32x{n})(((pt_i32x{n})xc & (int32_t)0x80000000) | 0x3f000000);
  pt_i32x{n} ni = __builtin_convertvector(xc + half, pt_i32x{n});
  pt_f32x{n} r = xc - __builtin_convertvector(ni, pt_f32x{n});
  pt_f32x{n} p = r * 1.5403530393381606e-4f + 1.3333558146428443e-3f;
  p = p * r + 9.618129107628477e-3f; p = p * r + 5.550410866482158e-2f; p = p * r + 2.402265069591007e-1f;
  p = p * r + 6.931471805599453e-1f; p = p * r + 1.0f;
""" + _TIMES_2N
# with AVX-512 the 16-lane exp clamps with max/min (NaN kept: they return their second operand
# when one is NaN), rounds with vrndscaleps and scales by 2^n with vscalefps, which gives 0 and
# inf at the ends of the range by itself (max relative error 1.2e-7 over [-87, 88.7], denormal
# results as libm's): about half the instructions of the portable one, which matters because
# the attention kernel takes the exp of every score (20% of its time with the portable one)
_AVX512_EXP = r"""#if defined(__AVX512F__)
#include <immintrin.h>
static inline pt_f32x16 pt_exp_f32x16(pt_f32x16 x) {
  __m512 xc = _mm512_min_ps(_mm512_set1_ps(100.0f), _mm512_max_ps(_mm512_set1_ps(-200.0f), (__m512)x));
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), xc);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(1.9875691500E-4f), r, _mm512_set1_ps(1.3981999507E-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073E-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894E-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459E-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201E-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return (pt_f32x16)_mm512_scalef_ps(p, n); }
/* 2^x: no Cody-Waite step (r = x - round(x) is exact), degree-6 Taylor polynomial of 2^r on
   [-1/2, 1/2] (relative error 1.2e-7 there); NaN kept, 0 and inf at the ends */
static inline pt_f32x16 pt_exp2_f32x16(pt_f32x16 x) {
  __m512 xc = _mm512_min_ps(_mm512_set1_ps(129.0f), _mm512_max_ps(_mm512_set1_ps(-200.0f), (__m512)x));
  __m512 n = _mm512_roundscale_ps(xc, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_sub_ps(xc, n);
  __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(1.5403530393381606e-4f), r, _mm512_set1_ps(1.3333558146428443e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(9.618129107628477e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.550410866482158e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(2.402265069591007e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(6.931471805599453e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return (pt_f32x16)_mm512_scalef_ps(p, n); }
#else
""" + _VECTOR_EXP.format(n=16) + _VECTOR_EXP2.format(n=16) + "#endif\n"
# a vector that must stay in a register (op ``in_register``): an empty asm that claims to change
# it keeps gcc from folding its load into every FMA that uses it (one 512-bit load per FMA: the
# load port, not the FMA units, then sets the pace). Where the register class is unknown, a no-op.
_IN_REGISTER = r"""#if defined(__x86_64__) && defined(__AVX512F__)
#define PT_HALF_VECTORS __attribute__((target("prefer-vector-width=256")))
#else
#define PT_HALF_VECTORS
#endif
#if defined(__x86_64__) && defined(__AVX512F__)
#define PT_REG16(x) ({ pt_f32x16 _r = (x); __asm__("" : "+v"(_r)); _r; })
#else
#define PT_REG16(x) (x)
#endif
#if defined(__x86_64__) && defined(__AVX__)
#define PT_REG8(x) ({ pt_f32x8 _r = (x); __asm__("" : "+v"(_r)); _r; })
#else
#define PT_REG8(x) (x)
#endif
#if defined(__x86_64__) && defined(__SSE2__)
#define PT_REG4(x) ({ pt_f32x4 _r = (x); __asm__("" : "+x"(_r)); _r; })
#elif defined(__aarch64__) && defined(__ARM_NEON)
#define PT_REG4(x) ({ pt_f32x4 _r = (x); __asm__("" : "+w"(_r)); _r; })
#else
#define PT_REG4(x) (x)
#endif
"""
# the lanes of v where the mask m is nonzero, zeros elsewhere (op ``keep_lanes``; bitwise, so
# the zeros are exact whatever the dropped lanes held); the lanes of a where m is nonzero, of b
# elsewhere (op ``pick_lanes``, bitwise too)
_KEEP_LANES = "".join(
    f"static inline pt_f32x{n} pt_keep_f32x{n}(pt_f32x{n} m, pt_f32x{n} v) {{\n"
    f"  return (pt_f32x{n})((pt_i32x{n})(m != 0) & (pt_i32x{n})v); }}\n"
    f"static inline pt_f32x{n} pt_pick_f32x{n}(pt_f32x{n} m, pt_f32x{n} a, pt_f32x{n} b) {{\n"
    f"  pt_i32x{n} k = (pt_i32x{n})(m != 0);\n"
    f"  return (pt_f32x{n})((k & (pt_i32x{n})a) | (~k & (pt_i32x{n})b)); }}\n" for n in (4, 8, 16))
# half-precision vectors (contraction operands read in place, ``affine.ir.widening``): bfloat16
# as its bits, widened by a shift, narrowed with round-to-nearest-even and the canonical NaN as
# the scalar pt_f32_bf16; float16 converted by the compiler (F16C's vcvtph2ps where present)
_HALF_VECTORS = "".join(
    f"typedef uint16_t pt_bf16x{n} __attribute__((vector_size({2 * n}), aligned(2)));\n"
    f"typedef _Float16 pt_f16x{n} __attribute__((vector_size({2 * n}), aligned(2)));\n"
    f"typedef uint32_t pt_u32x{n} __attribute__((vector_size({4 * n})));\n"
    # (int8 and uint8: quantized contraction operands, converted exactly to float32 lanes)
    f"typedef int8_t pt_i8x{n} __attribute__((vector_size({n}), aligned(1)));\n"
    f"typedef uint8_t pt_u8x{n} __attribute__((vector_size({n}), aligned(1)));\n"
    f"static inline pt_f32x{n} pt_bf16_f32x{n}(pt_bf16x{n} h) {{\n"
    f"  return (pt_f32x{n})(__builtin_convertvector(h, pt_u32x{n}) << 16); }}\n"
    f"static inline pt_bf16x{n} pt_f32_bf16x{n}(pt_f32x{n} f) {{\n"
    f"  pt_u32x{n} u = (pt_u32x{n})f;\n"
    f"  pt_u32x{n} nan = (pt_u32x{n})((u & 0x7fffffffu) > 0x7f800000u);\n"
    f"  pt_u32x{n} r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;\n"
    f"  return __builtin_convertvector((r & ~nan) | (0x7fc0u & nan), pt_bf16x{n}); }}\n" for n in (4, 8, 16))
# bfloat16 pairs (``transform.bf16_pairs``): two consecutive elements read as the bits of one
# float (may_alias: the buffer is uint16_t), two rows' elements paired by a pack (pt_pair_of),
# and their dot product into float32 lanes: vdpbf16ps where the compiler targets AVX512_BF16,
# else the same products (exact in float32) added in its order, odd element first
_PAIRS = r"""typedef float pt_pair __attribute__((may_alias, aligned(2)));
static inline float pt_pair_of(uint16_t a, uint16_t b) {
  uint32_t u = (uint32_t)a | ((uint32_t)b << 16); float f; __builtin_memcpy(&f, &u, 4); return f; }
""" + "".join(
    f"typedef float pt_pairx{n} __attribute__((vector_size({4 * n}), may_alias, aligned(2)));\n"
    f"static inline pt_f32x{n} pt_pair_of_x{n}(pt_bf16x{n} a, pt_bf16x{n} b) {{\n"
    f"  return (pt_f32x{n})(__builtin_convertvector(a, pt_u32x{n}) | (__builtin_convertvector(b, pt_u32x{n}) << 16)); }}\n"
    f"static inline pt_f32x{n} pt_dot2_emul_f32x{n}(pt_f32x{n} acc, float x, pt_f32x{n} y) {{\n"
    f"  uint32_t u; __builtin_memcpy(&u, &x, 4);\n"
    f"  pt_u32x{n} a = (pt_u32x{n}){{}} + u, b = (pt_u32x{n})y;\n"
    f"  return acc + (pt_f32x{n})(a & 0xffff0000u) * (pt_f32x{n})(b & 0xffff0000u)\n"
    f"             + (pt_f32x{n})(a << 16) * (pt_f32x{n})(b << 16); }}\n" for n in (4, 8, 16)) + r"""#if defined(__x86_64__) && defined(__AVX512BF16__)
#include <immintrin.h>
static inline pt_f32x16 pt_dot2_f32x16(pt_f32x16 acc, float x, pt_f32x16 y) {
  return (pt_f32x16)_mm512_dpbf16_ps((__m512)acc, (__m512bh)_mm512_set1_ps(x), (__m512bh)y); }
#else
#define pt_dot2_f32x16 pt_dot2_emul_f32x16
#endif
#if defined(__x86_64__) && defined(__AVX512BF16__) && defined(__AVX512VL__)
static inline pt_f32x8 pt_dot2_f32x8(pt_f32x8 acc, float x, pt_f32x8 y) {
  return (pt_f32x8)_mm256_dpbf16_ps((__m256)acc, (__m256bh)_mm256_set1_ps(x), (__m256bh)y); }
static inline pt_f32x4 pt_dot2_f32x4(pt_f32x4 acc, float x, pt_f32x4 y) {
  return (pt_f32x4)_mm_dpbf16_ps((__m128)acc, (__m128bh)_mm_set1_ps(x), (__m128bh)y); }
#else
#define pt_dot2_f32x8 pt_dot2_emul_f32x8
#define pt_dot2_f32x4 pt_dot2_emul_f32x4
#endif
"""
# int8 quads (``transform.int8_quads``): four consecutive bytes read as the bits of one float,
# their dot products summed into int32 lanes kept in float registers (bits): vpdpbusd where the
# compiler targets AVX512-VNNI, else the same integer arithmetic. The row operand's quad x is
# broadcast; us: x unsigned, y signed; su: x signed, y unsigned
_QUADS = r"""typedef float pt_quad __attribute__((may_alias, aligned(1)));
static inline float pt_quad_of(uint8_t a, uint8_t b, uint8_t c, uint8_t d) {
  uint32_t u = (uint32_t)a | ((uint32_t)b << 8) | ((uint32_t)c << 16) | ((uint32_t)d << 24);
  float f; __builtin_memcpy(&f, &u, 4); return f; }
""" + "".join(
    f"static inline pt_f32x{n} pt_quad_of_x{n}(pt_u8x{n} a, pt_u8x{n} b, pt_u8x{n} c, pt_u8x{n} d) {{\n"
    f"  return (pt_f32x{n})(__builtin_convertvector(a, pt_u32x{n}) | (__builtin_convertvector(b, pt_u32x{n}) << 8)\n"
    f"    | (__builtin_convertvector(c, pt_u32x{n}) << 16) | (__builtin_convertvector(d, pt_u32x{n}) << 24)); }}\n"
    f"typedef float pt_quadx{n} __attribute__((vector_size({4 * n}), may_alias, aligned(1)));\n"
    f"static inline pt_f32x{n} pt_dot4_emul_x{n}(pt_f32x{n} acc, pt_u32x{n} u, pt_u32x{n} s) {{\n"
    f"  pt_i32x{n} a = (pt_i32x{n})acc;\n"
    + "".join(f"  a += (pt_i32x{n})((u >> {8 * k}) & 0xffu) * ((pt_i32x{n})(s << {24 - 8 * k}) >> 24);\n" for k in range(4))
    + f"  return (pt_f32x{n})a; }}\n"
    f"static inline pt_u32x{n} pt_quad_all_x{n}(float x) {{\n"
    f"  uint32_t u; __builtin_memcpy(&u, &x, 4); return (pt_u32x{n}){{}} + u; }}\n" for n in (4, 8, 16)) + r"""#if defined(__x86_64__) && defined(__AVX512VNNI__)
#include <immintrin.h>
static inline pt_f32x16 pt_dot4us_x16(pt_f32x16 acc, float x, pt_f32x16 y) {
  return (pt_f32x16)_mm512_dpbusd_epi32((__m512i)acc, (__m512i)pt_quad_all_x16(x), (__m512i)y); }
static inline pt_f32x16 pt_dot4su_x16(pt_f32x16 acc, float x, pt_f32x16 y) {
  return (pt_f32x16)_mm512_dpbusd_epi32((__m512i)acc, (__m512i)y, (__m512i)pt_quad_all_x16(x)); }
#else
#define pt_dot4us_x16(acc, x, y) pt_dot4_emul_x16(acc, pt_quad_all_x16(x), (pt_u32x16)(y))
#define pt_dot4su_x16(acc, x, y) pt_dot4_emul_x16(acc, (pt_u32x16)(y), pt_quad_all_x16(x))
#endif
#if defined(__x86_64__) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
static inline pt_f32x8 pt_dot4us_x8(pt_f32x8 acc, float x, pt_f32x8 y) {
  return (pt_f32x8)_mm256_dpbusd_epi32((__m256i)acc, (__m256i)pt_quad_all_x8(x), (__m256i)y); }
static inline pt_f32x8 pt_dot4su_x8(pt_f32x8 acc, float x, pt_f32x8 y) {
  return (pt_f32x8)_mm256_dpbusd_epi32((__m256i)acc, (__m256i)y, (__m256i)pt_quad_all_x8(x)); }
static inline pt_f32x4 pt_dot4us_x4(pt_f32x4 acc, float x, pt_f32x4 y) {
  return (pt_f32x4)_mm_dpbusd_epi32((__m128i)acc, (__m128i)pt_quad_all_x4(x), (__m128i)y); }
static inline pt_f32x4 pt_dot4su_x4(pt_f32x4 acc, float x, pt_f32x4 y) {
  return (pt_f32x4)_mm_dpbusd_epi32((__m128i)acc, (__m128i)y, (__m128i)pt_quad_all_x4(x)); }
#else
""" + "".join(f"#define pt_dot4us_x{n}(acc, x, y) pt_dot4_emul_x{n}(acc, pt_quad_all_x{n}(x), (pt_u32x{n})(y))\n"
              f"#define pt_dot4su_x{n}(acc, x, y) pt_dot4_emul_x{n}(acc, (pt_u32x{n})(y), pt_quad_all_x{n}(x))\n"
              for n in (4, 8)) + "#endif\n"
PRELUDE = (_PRELUDE_HEAD + "".join(_VECTOR_EXP.format(n=n) + _VECTOR_EXP2.format(n=n) for n in (4, 8)) + _AVX512_EXP
           + _KEEP_LANES + _HALF_VECTORS + _PAIRS + _QUADS + _IN_REGISTER + _PRELUDE_TAIL)
