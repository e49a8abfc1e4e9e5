// mlp_common.h — what the MLP training job (mlp_train.cu) and its CPU reference (mlp_reference.cc) share.
// Arguments, synthetic data, launch geometry, output format and checksum live here once, so the two mirror each other.
//
// Plain C++ only: nvcc compiles this as host code for the .cu, g++ for the reference. What this header
// feeds into the computation (data, scales, seeds) comes from integers or from float/double operations
// that round the same with or without FMA contraction, so both builds start from the same bits.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

namespace mlp {

struct MlpConfig {
  // Sizes are int because cuBLAS takes int dimensions; element counts are computed in 64 bits.
  int input = 64;
  int hidden = 128;
  int layers = 2;  // hidden layers; 0 makes a single linear layer input -> output
  int output = 16;
  int batch = 64;
  int steps = 20;
  float lr = -1.0f;  // negative: pick from the width, see learning_rate()
  uint64_t seed = 1;
  // The first `frozen` layers (of layers + 1) keep their initial parameters, as in fine-tuning with a
  // frozen backbone: their tensors are only read after init (what incremental dumps leave out).
  int frozen = 0;
  // A device buffer of this many MiB, filled at start and read only at the end (its checksum is a
  // line of its own): state a job keeps but rarely touches (an EMA copy, evaluation data), which a
  // lazy restore loads last.
  int reserve_mib = 0;
  // Not part of the computation: the CUDA program prints each step's wall time to stderr
  // (bench/async_step_bench.sh reads it); the reference accepts the flag and ignores it.
  bool step_times = false;
  // Not part of the computation either: the CUDA program makes the next step's batch on this many
  // threads while the current step runs (as a data loader's workers do), instead of at each step's
  // start on its own thread, where the GPU waits for it. The batches are the same; the reference
  // accepts the option and ignores it.
  int prefetch = 0;
};

// ---- model shape --------------------------------------------------------------------------------

// Feature sizes from input to output: dims[0] = input, dims[1..layers] = hidden, dims[layers+1] = output.
// Weight layer l maps dims[l] -> dims[l+1]; its weight is dims[l+1] x dims[l] column-major.
inline std::vector<int> layer_dims(const MlpConfig& c) {
  std::vector<int> d;
  d.push_back(c.input);
  for (int i = 0; i < c.layers; ++i) d.push_back(c.hidden);
  d.push_back(c.output);
  return d;
}

inline long long weight_count(const std::vector<int>& d, size_t l) { return static_cast<long long>(d[l + 1]) * d[l]; }

// In double, for limits and sizing where the exact count might overflow.
inline double parameter_count_estimate(const MlpConfig& c) {
  const double in = c.input, h = c.hidden, out = c.output, L = c.layers;
  if (c.layers == 0) return out * in + out;
  return h * in + h + (L - 1) * (h * h + h) + out * h + out;
}

inline long long parameter_count(const MlpConfig& c) {
  const std::vector<int> d = layer_dims(c);
  long long n = 0;
  for (size_t l = 0; l + 1 < d.size(); ++l) n += weight_count(d, l) + d[l + 1];
  return n;
}

inline long long parameter_bytes(const MlpConfig& c) { return parameter_count(c) * static_cast<long long>(sizeof(float)); }

// Plain SGD's stable step size shrinks as hidden layers widen (the output moves by a sum over
// `hidden` features per layer), so the default scales as 1/(hidden*layers): about 0.1 at 64 MiB of
// parameters, capped at 2 for small models. Measured on this job's data, not a general rule.
inline float learning_rate(const MlpConfig& c) {
  if (c.lr >= 0.0f) return c.lr;
  if (c.layers == 0) return 2.0f;
  const double lr = 1024.0 / (static_cast<double>(c.hidden) * c.layers);
  return static_cast<float>(lr < 2.0 ? lr : 2.0);
}

// ---- hashing ------------------------------------------------------------------------------------

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

inline uint64_t hash3(uint64_t seed, uint64_t a, uint64_t b) {
  return splitmix64(seed ^ splitmix64(a ^ splitmix64(b)));
}

// Uniform in [-1, 1): a 24-bit integer scaled by a power of two, so the float is exact.
inline float hash_unit(uint64_t h) {
  const long long centered = static_cast<long long>(h >> 40) - (1ll << 23);
  return static_cast<float>(centered) * (1.0f / 8388608.0f);
}

// Seed for mlp_init_uniform of tensor `tensor` (2l: weight l, 2l+1: bias l).
inline uint64_t tensor_seed(const MlpConfig& c, int tensor) { return hash3(c.seed, 0x706172616d73ull, tensor); }

// Weights and biases of layer l are uniform in +-1/sqrt(fan_in), like torch.nn.Linear's defaults.
inline float init_scale(long long fan_in) { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(fan_in))); }

// MSE = sum of squared errors / (output*batch); its gradient is 2*(y - t) / (output*batch).
inline float loss_scale(const MlpConfig& c) { return static_cast<float>(1.0 / (static_cast<double>(c.output) * c.batch)); }
inline float grad_scale(const MlpConfig& c) { return static_cast<float>(2.0 / (static_cast<double>(c.output) * c.batch)); }

// ---- synthetic data -----------------------------------------------------------------------------

// Inputs are fresh noise each step; targets are a fixed smooth "teacher" of the inputs,
// target_j = c_j + sin(sum_i x_i * t_ij), so there is something to learn and the loss falls. The offsets
// c_j are learned within a few steps at any width, so even a short run shows a clear decrease above the
// batch-to-batch noise; the sin part keeps later steps improving.
class DataGen {
 public:
  explicit DataGen(const MlpConfig& c)
      : c_(c), teacher_(static_cast<size_t>(c.input) * static_cast<size_t>(c.output)),
        offset_(static_cast<size_t>(c.output)) {
    // Teacher weights give sum_i x_i t_ij a standard deviation of about 0.8: sin stays in its smooth part.
    const float s = static_cast<float>(1.4 / std::sqrt(static_cast<double>(c.input)));
    for (long long j = 0; j < c.output; ++j) {
      for (long long i = 0; i < c.input; ++i)
        teacher_[static_cast<size_t>(j + i * c.output)] = hash_unit(hash3(c.seed, 0x7465616368ull + j, i)) * s;
      offset_[static_cast<size_t>(j)] = hash_unit(hash3(c.seed, 0x6f6666736574ull, j));
    }
  }

  // x: input x batch, t: output x batch, both column-major (one column per sample).
  void batch(int step, float* x, float* t) const { batch_range(step, x, t, 0, c_.batch); }

  // Samples [first, end) of step's batch, written where batch() writes them: each sample's values
  // are its own (blocks only group samples), so threads may make disjoint ranges side by side.
  void batch_range(int step, float* x, float* t, long long first, long long end) const {
    const long long in = c_.input, out = c_.output;
    for (long long b = first; b < end; ++b) {
      float* xb = x + b * in;
      for (long long i = 0; i < in; ++i) xb[i] = hash_unit(hash3(c_.seed + 0x64617461ull, step, b * in + i));
    }
    // target_j = c_j + sin(sum_i x_i t_ij), each sum over i in order, so it rounds as one plain loop
    // would. All targets of kBlock samples go at once (z += x_i * row i of the teacher): their adds
    // overlap instead of each waiting for the one before, and each row of the teacher is read once
    // per block, not per sample. One sum at a time took ~85 ms a batch at the bench's size, more than
    // the GPU's part of a step (bench/step_spread.sh). Float x float is exact in double, so a fused
    // multiply-add rounds like the plain sum.
    std::vector<double> z(static_cast<size_t>(kBlock * out));
    for (long long b0 = first; b0 < end; b0 += kBlock) {
      const long long nb = std::min<long long>(kBlock, end - b0);
      std::fill(z.begin(), z.end(), 0.0);
      for (long long i = 0; i < in; ++i) {
        const float* td = teacher_.data() + i * out;
        for (long long k = 0; k < nb; ++k) {
          const double xi = static_cast<double>(x[(b0 + k) * in + i]);
          double* zk = z.data() + k * out;
          long long j = 0;
          for (; j + 8 <= out; j += 8)  // a fixed count: compilers make it vector code at -O2
            for (int u = 0; u < 8; ++u) zk[j + u] += xi * static_cast<double>(td[j + u]);
          for (; j < out; ++j) zk[j] += xi * static_cast<double>(td[j]);
        }
      }
      for (long long k = 0; k < nb; ++k)
        for (long long j = 0; j < out; ++j)
          t[j + (b0 + k) * out] = static_cast<float>(static_cast<double>(offset_[static_cast<size_t>(j)]) +
                                                     std::sin(z[static_cast<size_t>(k * out + j)]));
    }
  }

 private:
  MlpConfig c_;
  static constexpr long long kBlock = 8;
  std::vector<float> teacher_;  // input x output, row i: input i's weight in each target
  std::vector<float> offset_;   // c_j in [-1, 1)
};

// ---- launch geometry (identical for the GPU program and the reference) ----------------------------

struct Launch {
  unsigned grid;
  unsigned block;
};

inline constexpr unsigned kBlock = 256;
inline constexpr unsigned kMaxGrid = 4096;  // grid-stride loops cover the rest

// One thread per element (or per row/column), capped: large tensors loop inside each thread.
inline Launch launch_for(long long items) {
  long long blocks = (items + kBlock - 1) / kBlock;
  if (blocks < 1) blocks = 1;
  if (blocks > kMaxGrid) blocks = kMaxGrid;
  return Launch{static_cast<unsigned>(blocks), kBlock};
}

inline constexpr Launch kSingleThread{1, 1};

// ---- output ------------------------------------------------------------------------------------

inline constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ull;
inline constexpr uint64_t kFnvPrime = 0x100000001b3ull;

inline uint64_t fnv1a64(const void* data, size_t n, uint64_t h = kFnvOffset) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= kFnvPrime;
  }
  return h;
}

// FNV-1a over the parameter bytes and their sum, fed tensor by tensor (and chunk by chunk) in layer order.
struct ParamChecksum {
  uint64_t fnv = kFnvOffset;
  double sum = 0.0;
  // One pass: the running sum's add latency hides behind FNV's serial multiply chain, which is the
  // whole cost (about 1 ns per byte, i.e. ~1 s per GiB of parameters).
  void add(const float* p, size_t count) {
    uint64_t h = fnv;
    double s = sum;
    for (size_t i = 0; i < count; ++i) {
      unsigned char b[sizeof(float)];
      std::memcpy(b, p + i, sizeof b);
      for (unsigned char byte : b) {
        h ^= byte;
        h *= kFnvPrime;
      }
      s += static_cast<double>(p[i]);
    }
    fnv = h;
    sum = s;
  }
};

inline void print_step(std::FILE* out, int step, float loss) {
  std::fprintf(out, "step %d loss %.9g\n", step, static_cast<double>(loss));
}

inline void print_checksum(std::FILE* out, const ParamChecksum& c) {
  std::fprintf(out, "checksum %016" PRIx64 " sum %.9g\n", c.fnv, c.sum);
}
inline void print_reserve_checksum(std::FILE* out, const ParamChecksum& c) {
  std::fprintf(out, "reserve checksum %016" PRIx64 " sum %.9g\n", c.fnv, c.sum);
}
// Seed of the --reserve-mib buffer's mlp_init_uniform (beyond every tensor's).
inline uint64_t reserve_seed(const MlpConfig& c) { return hash3(c.seed, 0x72657365727665ull, 0); }

// ---- arguments ---------------------------------------------------------------------------------

inline const char* usage_text() {
  return "options (all optional):\n"
         "  --input N       input features            (default 64)\n"
         "  --hidden N      width of each hidden layer (default 128)\n"
         "  --layers N      number of hidden layers    (default 2; 0 = one linear layer)\n"
         "  --output N      output features           (default 16)\n"
         "  --batch N       samples per step          (default 64)\n"
         "  --steps N       SGD steps                 (default 20)\n"
         "  --lr F          learning rate             (default min(2, 1024/(hidden*layers)))\n"
         "  --seed N        seed for data and init    (default 1)\n"
         "  --param-mib N   pick --hidden so the parameters take about N MiB (needs --layers >= 1)\n"
         "  --frozen N      the first N layers are not trained (default 0; at most layers + 1)\n"
         "  --reserve-mib N a device buffer of N MiB set at start, read only at the end (default 0)\n"
         "  --step-times    print each step's time and phases to stderr (CUDA program only; stdout unchanged)\n"
         "  --prefetch N    make the next batch on N threads during each step (CUDA program only; 0: at its start)\n"
         "  --help          print this and exit\n";
}

// Largest supported tensor side: cuBLAS takes int dimensions and leading dimensions.
inline constexpr long long kMaxDim = std::numeric_limits<int>::max();

namespace detail {
inline bool parse_int(const char* s, long long lo, long long hi, long long* out) {
  if (s == nullptr || *s == '\0') return false;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(s, &end, 10);
  if (errno != 0 || *end != '\0' || v < lo || v > hi) return false;
  *out = v;
  return true;
}
}  // namespace detail

// hidden such that parameter_bytes is closest to `mib` MiB, the other sizes fixed (needs layers >= 1).
inline int hidden_for_param_mib(MlpConfig c, long long mib) {
  const double target = static_cast<double>(mib) * 1024 * 1024;
  auto bytes = [&](long long h) {
    c.hidden = static_cast<int>(h);
    return parameter_count_estimate(c) * sizeof(float);
  };
  // bytes() grows with hidden: binary-search the last h with bytes(h) <= target.
  long long lo = 1, hi = kMaxDim;
  if (bytes(lo) > target) return 1;
  while (lo < hi) {  // invariant: bytes(lo) <= target
    const long long mid = lo + (hi - lo + 1) / 2;
    if (bytes(mid) <= target) lo = mid; else hi = mid - 1;
  }
  if (lo < kMaxDim && bytes(lo + 1) - target < target - bytes(lo)) ++lo;
  return static_cast<int>(lo);
}

struct ParseResult {
  bool ok = false;
  bool help = false;
  std::string error;  // when !ok && !help
};

inline ParseResult parse_args(int argc, const char* const* argv, MlpConfig* cfg) {
  ParseResult r;
  MlpConfig c;
  long long param_mib = -1;
  bool hidden_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      r.help = true;
      return r;
    }
    if (a.rfind("--", 0) != 0) {
      r.error = "unexpected argument '" + a + "'";
      return r;
    }
    if (a == "--step-times") {  // the one flag without a value
      c.step_times = true;
      continue;
    }
    if (i + 1 >= argc) {
      r.error = "missing value for " + a;
      return r;
    }
    const char* v = argv[++i];
    auto bad = [&](const char* what) {
      r.error = "bad value '" + std::string(v) + "' for " + a + " (expected " + what + ")";
      return r;
    };
    long long n = 0;
    if (a == "--input" || a == "--hidden" || a == "--output" || a == "--batch") {
      if (!detail::parse_int(v, 1, kMaxDim, &n)) return bad("an integer in [1, 2147483647]");
      (a == "--input" ? c.input : a == "--hidden" ? c.hidden : a == "--output" ? c.output : c.batch) =
          static_cast<int>(n);
      if (a == "--hidden") hidden_given = true;
    } else if (a == "--layers") {
      if (!detail::parse_int(v, 0, 1000000, &n)) return bad("an integer in [0, 1000000]");
      c.layers = static_cast<int>(n);
    } else if (a == "--steps") {
      if (!detail::parse_int(v, 0, std::numeric_limits<int>::max(), &n)) return bad("an integer in [0, 2147483647]");
      c.steps = static_cast<int>(n);
    } else if (a == "--lr") {
      errno = 0;
      char* end = nullptr;
      const double d = std::strtod(v, &end);
      if (*v == '\0' || *end != '\0' || errno != 0 || !std::isfinite(d) || d < 0 ||
          d > std::numeric_limits<float>::max())
        return bad("a finite non-negative number");
      c.lr = static_cast<float>(d);
    } else if (a == "--seed") {
      errno = 0;
      char* end = nullptr;
      if (*v == '\0' || *v == '-' || *v == '+') return bad("an unsigned 64-bit integer");
      const unsigned long long s = std::strtoull(v, &end, 10);
      if (*end != '\0' || errno != 0) return bad("an unsigned 64-bit integer");
      c.seed = s;
    } else if (a == "--frozen") {
      if (!detail::parse_int(v, 0, 1000001, &n)) return bad("an integer in [0, 1000001]");
      c.frozen = static_cast<int>(n);
    } else if (a == "--reserve-mib") {
      if (!detail::parse_int(v, 0, 1 << 20, &n)) return bad("an integer in [0, 1048576]");
      c.reserve_mib = static_cast<int>(n);
    } else if (a == "--prefetch") {
      if (!detail::parse_int(v, 0, 64, &n)) return bad("an integer in [0, 64]");
      c.prefetch = static_cast<int>(n);
    } else if (a == "--param-mib") {
      if (!detail::parse_int(v, 1, 1ll << 30, &n)) return bad("an integer in [1, 1073741824]");
      param_mib = n;
    } else {
      r.error = "unknown option '" + a + "'";
      return r;
    }
  }
  if (c.frozen > c.layers + 1) {
    r.error = "--frozen " + std::to_string(c.frozen) + " exceeds the " + std::to_string(c.layers + 1) + " layers";
    return r;
  }
  if (param_mib > 0) {
    if (hidden_given) {
      r.error = "--hidden and --param-mib are mutually exclusive";
      return r;
    }
    if (c.layers < 1) {
      r.error = "--param-mib needs --layers >= 1 (it sizes the hidden layers)";
      return r;
    }
    c.hidden = hidden_for_param_mib(c, param_mib);
  }
  // Keeps every 64-bit element count far from overflow; real limits are device and host memory.
  if (parameter_count_estimate(c) * sizeof(float) > static_cast<double>(1ll << 50)) {
    r.error = "the parameters would exceed 1 PiB";
    return r;
  }
  *cfg = c;
  r.ok = true;
  return r;
}

// For main(): returns -1 to go on, else the exit code (0 after --help, 2 after a usage error).
inline int parse_args_or_exit_code(int argc, const char* const* argv, MlpConfig* cfg) {
  const char* prog = argc > 0 ? argv[0] : "mlp";
  const ParseResult r = parse_args(argc, argv, cfg);
  if (r.help) {
    std::printf("usage: %s [options]\nTrains an MLP with SGD on synthetic data; prints per-step loss and a "
                "parameter checksum.\n%s",
                prog, usage_text());
    return 0;
  }
  if (!r.ok) {
    std::fprintf(stderr, "%s: %s\n%s", prog, r.error.c_str(), usage_text());
    return 2;
  }
  return -1;
}

// One line for stderr describing the run (never stdout: stdout is compared byte for byte).
inline void describe(std::FILE* err, const char* prog, const MlpConfig& c) {
  std::fprintf(err, "%s: input %d hidden %d layers %d output %d batch %d steps %d lr %g seed %" PRIu64
                    " params %lld (%.1f MiB)\n",
               prog, c.input, c.hidden, c.layers, c.output, c.batch, c.steps, static_cast<double>(learning_rate(c)), c.seed,
               parameter_count(c), static_cast<double>(parameter_bytes(c)) / (1024.0 * 1024.0));
}

}  // namespace mlp
