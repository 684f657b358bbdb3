// Element-wise kernels of parbench::compute::cuda, compiled at run time by
// NVRTC once per storage type (PB_DTYPE: 0 f32, 1 f16, 2 bf16). Arithmetic
// is in f32; f16/bf16 are carried as raw 16-bit words and converted here,
// so no CUDA header is needed. Rounding is to nearest even, as the `half`
// crate rounds on the host.

#if PB_DTYPE == 0
typedef float T;
__device__ __forceinline__ float ld(T x) { return x; }
__device__ __forceinline__ T st(float x) { return x; }
#elif PB_DTYPE == 1
typedef unsigned short T;
__device__ __forceinline__ float ld(T x) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x));
    return f;
}
__device__ __forceinline__ T st(float x) {
    T h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return h;
}
#else
typedef unsigned short T;
__device__ __forceinline__ float ld(T x) { return __uint_as_float(((unsigned int)x) << 16); }
__device__ __forceinline__ T st(float x) {
    unsigned int u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (T)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (T)(u >> 16);
}
#endif

typedef unsigned long long u64;

#define GRID_STRIDE(i, n) \
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (u64)gridDim.x * blockDim.x)

extern "C" __global__ void pb_add_bias(T* x, const T* b, u64 rows, u64 cols) {
    GRID_STRIDE(i, rows * cols) { x[i] = st(ld(x[i]) + ld(b[i % cols])); }
}

extern "C" __global__ void pb_bias_grad(const T* dy, T* db, u64 rows, u64 cols) {
    GRID_STRIDE(c, cols) {
        float s = 0.f;
        for (u64 r = 0; r < rows; ++r) s += ld(dy[r * cols + c]);
        db[c] = st(s);
    }
}

__device__ __forceinline__ float gelu_inner(float x) {
    const float k = 0.7978845608028654f;  // sqrt(2/pi)
    return k * (x + 0.044715f * x * x * x);
}

extern "C" __global__ void pb_gelu(const T* x, T* y, u64 n) {
    GRID_STRIDE(i, n) {
        float v = ld(x[i]);
        y[i] = st(0.5f * v * (1.f + tanhf(gelu_inner(v))));
    }
}

extern "C" __global__ void pb_gelu_backward(const T* x, const T* dy, T* dx, u64 n) {
    const float k = 0.7978845608028654f;
    GRID_STRIDE(i, n) {
        float v = ld(x[i]);
        float t = tanhf(gelu_inner(v));
        float du = k * (1.f + 3.f * 0.044715f * v * v);
        float d = 0.5f * (1.f + t) + 0.5f * v * (1.f - t * t) * du;
        dx[i] = st(ld(dy[i]) * d);
    }
}

extern "C" __global__ void pb_add(T* x, const T* y, u64 n) {
    GRID_STRIDE(i, n) { x[i] = st(ld(x[i]) + ld(y[i])); }
}

// c[r * ld + col] *= beta for a rows x cols matrix (a product with k = 0).
extern "C" __global__ void pb_scale_matrix(T* c, u64 rows, u64 cols, u64 ldc, float beta) {
    GRID_STRIDE(i, rows * cols) {
        u64 r = i / cols, col = i % cols;
        c[r * ldc + col] = st(beta == 0.f ? 0.f : beta * ld(c[r * ldc + col]));
    }
}

#define BLOCK 256

__device__ float block_max(float v, float* sh) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        v = threadIdx.x < (BLOCK / 32) ? sh[threadIdx.x] : __int_as_float(0xff800000);
        for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
        if (threadIdx.x == 0) sh[0] = v;
    }
    __syncthreads();
    float r = sh[0];
    __syncthreads();
    return r;
}

__device__ float block_sum(float v, float* sh) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        v = threadIdx.x < (BLOCK / 32) ? sh[threadIdx.x] : 0.f;
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (threadIdx.x == 0) sh[0] = v;
    }
    __syncthreads();
    float r = sh[0];
    __syncthreads();
    return r;
}

// One block per row; with `causal`, row r keeps columns 0..=(r % cols), the rest become 0.
extern "C" __global__ void pb_softmax(T* x, u64 rows, u64 cols, int causal) {
    __shared__ float sh[BLOCK / 32];
    for (u64 row = blockIdx.x; row < rows; row += gridDim.x) {
        T* p = x + row * cols;
        u64 valid = causal ? (row % cols) + 1 : cols;
        float m = __int_as_float(0xff800000);
        for (u64 c = threadIdx.x; c < valid; c += BLOCK) m = fmaxf(m, ld(p[c]));
        m = block_max(m, sh);
        float s = 0.f;
        for (u64 c = threadIdx.x; c < valid; c += BLOCK) s += expf(ld(p[c]) - m);
        s = block_sum(s, sh);
        float inv = 1.f / s;
        for (u64 c = threadIdx.x; c < cols; c += BLOCK)
            p[c] = st(c < valid ? expf(ld(p[c]) - m) * inv : 0.f);
    }
}

// dy <- y * (dy - sum(dy * y)) per row.
extern "C" __global__ void pb_softmax_backward(const T* y, T* dy, u64 rows, u64 cols) {
    __shared__ float sh[BLOCK / 32];
    for (u64 row = blockIdx.x; row < rows; row += gridDim.x) {
        const T* py = y + row * cols;
        T* pd = dy + row * cols;
        float s = 0.f;
        for (u64 c = threadIdx.x; c < cols; c += BLOCK) s += ld(pd[c]) * ld(py[c]);
        s = block_sum(s, sh);
        for (u64 c = threadIdx.x; c < cols; c += BLOCK) pd[c] = st(ld(py[c]) * (ld(pd[c]) - s));
    }
}

// FP8 operands of cuBLASLt's E4M3 products: each operand's amax, then its
// cast with the per-tensor scale that maps amax to E4M3's largest finite
// value (448), written packed (and transposed where asked) in the layout
// cuBLASLt's FP8 kernels take.

extern "C" __global__ void pb_zero_u32(unsigned int* p, u64 n) {
    GRID_STRIDE(i, n) { p[i] = 0u; }
}

// max |x| over a rows x cols matrix of row stride lds, into *amax as the
// bits of a float: non-negative floats order as their bits, so atomicMax
// on the bits is the float maximum (and a NaN, whose bits are larger than
// infinity's, wins, so a NaN operand is seen in the result).
extern "C" __global__ void pb_amax(const T* x, u64 rows, u64 cols, u64 lds, unsigned int* amax) {
    float m = 0.f;
    GRID_STRIDE(i, rows * cols) {
        float v = fabsf(ld(x[(i / cols) * lds + i % cols]));
        if (v > m || v != v) m = v;
    }
    atomicMax(amax, __float_as_uint(m));
}

// OCP E4M3, rounded to nearest even and saturated to 448 (CUDA's
// __nv_fp8_e4m3 with __NV_SATFINITE), without cuda_fp8.h.
__device__ __forceinline__ unsigned char to_e4m3(float x) {
    unsigned int sign = (__float_as_uint(x) >> 24) & 0x80u;
    float a = fabsf(x);
    if (a != a) return 0x7f;
    if (a >= 448.f) return (unsigned char)(sign | 0x7eu);
    // Below 2^-6: subnormals in steps of 2^-9 (8 steps is the smallest normal).
    if (a < 0.015625f) return (unsigned char)(sign | (unsigned int)rintf(a * 512.f));
    int e = ilogbf(a);
    float r = rintf(ldexpf(a, 3 - e));
    if (r >= 16.f) {
        e += 1;
        r = 8.f;
    }
    unsigned int code = ((unsigned int)(e + 7) << 3) | ((unsigned int)r - 8u);
    return (unsigned char)(sign | (code > 0x7eu ? 0x7eu : code));
}

// out = E4M3(x * scale), scale = 448 / amax (1 when amax is 0), packed
// rows x cols (or cols x rows with transpose); *descale = 1 / scale, the
// factor cuBLASLt multiplies the product by.
extern "C" __global__ void pb_cast_e4m3(const T* x, u64 rows, u64 cols, u64 lds, int transpose,
                                        const unsigned int* amax, unsigned char* out,
                                        float* descale) {
    float a = __uint_as_float(*amax);
    float scale = a > 0.f ? 448.f / a : 1.f;
    if (blockIdx.x == 0 && threadIdx.x == 0) *descale = 1.f / scale;
    GRID_STRIDE(i, rows * cols) {
        u64 r = i / cols, c = i % cols;
        unsigned char q = to_e4m3(ld(x[r * lds + c]) * scale);
        if (transpose) {
            out[c * rows + r] = q;
        } else {
            out[i] = q;
        }
    }
}
