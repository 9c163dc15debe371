#include "kvsim/model/llama.hpp"

#include <atomic>
#include <cmath>
#include <cstdint>
#include <exception>
#include <numeric>
#include <thread>

#include "kvsim/core/blas.hpp"
#include "kvsim/core/error.hpp"
#include "kvsim/policies/policy.hpp"

namespace kvsim {
namespace {

void rmsnorm(float* out, const float* x, const float* w, int n, double eps) {
  double ss = 0;
  for (int i = 0; i < n; ++i) ss += double(x[i]) * x[i];
  float inv = static_cast<float>(1.0 / std::sqrt(ss / n + eps));
  for (int i = 0; i < n; ++i) out[i] = w[i] * (inv * x[i]);
}

/// out[rows] = W[rows, cols] · x[cols]
void matvec(float* out, const float* W, const float* x, int rows, int cols) {
  Eigen::Map<const MatF> Wm(W, rows, cols);
  Eigen::Map<const VecF> xv(x, cols);
  Eigen::Map<VecF>(out, rows).noalias() = Wm * xv;
}

/// Rotary embedding (RoFormer, Su et al. 2021, Eq. 34) of every head in vec[n] at position pos:
/// pair k (k < head_dim/2) turns by pos · θ^(−2k/head_dim). Pairs are channels (2k, 2k+1) or, with
/// `halves`, (k, k + head_dim/2) (LlamaConfig::rope_halves).
void rope(float* vec, int n, int head_dim, int pos, double theta, bool halves) {
  for (int h0 = 0; h0 < n; h0 += head_dim) {
    for (int k = 0; k < head_dim / 2; ++k) {
      const double freq = 1.0 / std::pow(theta, double(2 * k) / head_dim);
      const double val = pos * freq;
      const float fcr = static_cast<float>(std::cos(val)), fci = static_cast<float>(std::sin(val));
      const int a = h0 + (halves ? k : 2 * k), b = halves ? a + head_dim / 2 : a + 1;
      const float v0 = vec[a], v1 = vec[b];
      vec[a] = v0 * fcr - v1 * fci;
      vec[b] = v0 * fci + v1 * fcr;
    }
  }
}

/// GELU with the tanh approximation (Hendrycks & Gimpel 2016, Eq. in §2; PyTorch's
/// gelu(approximate="tanh"), Gemma's hidden_activation "gelu_pytorch_tanh").
inline float gelu_tanh(float x) { return 0.5f * x * (1.0f + std::tanh(0.7978845608028654f * (x + 0.044715f * x * x * x))); }

/// RMSNorm of each head_dim slice of vec[n] with the same weights (Gemma 3's q_norm / k_norm).
void rmsnorm_heads(float* vec, int n, int hd, const float* w, double eps) {
  for (int h0 = 0; h0 < n; h0 += hd) rmsnorm(vec + h0, vec + h0, w, hd, eps);
}

/// The rotary angles of position `pos` for RoPE base `theta`, rope()'s formula in double cast to float:
/// cs[k] = cos(pos · θ^(−2k/head_dim)), sn[k] the sine, k < head_dim/2 (prefill and decode_step).
void rope_angles(int64_t pos, double theta, int head_dim, float* cs, float* sn) {
  for (int k = 0; k < head_dim / 2; ++k) {
    const double val = double(pos) * (1.0 / std::pow(theta, double(2 * k) / head_dim));
    cs[k] = static_cast<float>(std::cos(val));
    sn[k] = static_cast<float>(std::sin(val));
  }
}

/// rope() with the angles of one position precomputed: cs[k], sn[k] for pair k.
void rope_rows(float* vec, int n, int head_dim, const float* cs, const float* sn, bool halves) {
  for (int h0 = 0; h0 < n; h0 += head_dim)
    for (int k = 0; k < head_dim / 2; ++k) {
      const int a = h0 + (halves ? k : 2 * k), b = halves ? a + head_dim / 2 : a + 1;
      const float v0 = vec[a], v1 = vec[b];
      vec[a] = v0 * cs[k] - v1 * sn[k];
      vec[b] = v0 * sn[k] + v1 * cs[k];
    }
}

}  // namespace

double mean_of(const std::vector<float>& v) {
  if (v.empty()) return 0;
  double s = 0;
  for (float x : v) s += x;
  return s / double(v.size());
}

float token_cross_entropy(const float* logits, int vocab, int target) {
  double mx = -INFINITY;
  for (int i = 0; i < vocab; ++i) mx = std::max(mx, double(logits[i]));
  double s = 0;
  for (int i = 0; i < vocab; ++i) s += std::exp(double(logits[i]) - mx);
  return static_cast<float>(mx + std::log(s) - logits[target]);
}

float token_cross_entropy(const std::vector<float>& logits, int target) {
  return token_cross_entropy(logits.data(), int(logits.size()), target);
}

LlamaModel::LlamaModel(const std::string& path) : path_(path) {
  Checkpoint ck = load_checkpoint(path);
  cfg_ = ck.cfg;
  data_ = std::move(ck.weights);
  const int64_t D = cfg_.dim, Hd = cfg_.hidden_dim, L = cfg_.n_layers, V = cfg_.vocab_size, KV = cfg_.kv_dim();
  const int64_t hs = cfg_.head_dim(), QD = cfg_.q_dim();
  const float* p = data_.data();
  emb_ = p; p += V * D;
  rms_att_ = p; p += L * D;
  wq_ = p; p += L * QD * D;
  wk_ = p; p += L * D * KV;
  wv_ = p; p += L * D * KV;
  wo_ = p; p += L * D * QD;
  rms_ffn_ = p; p += L * D;
  w1_ = p; p += L * D * Hd;
  w2_ = p; p += L * Hd * D;
  w3_ = p; p += L * D * Hd;
  rms_final_ = p; p += D;
  wcls_ = cfg_.shared_classifier ? emb_ : p;
  if (!cfg_.shared_classifier) p += V * D;
  if (cfg_.qk_norm) {
    q_norm_ = p; p += L * hs;
    k_norm_ = p; p += L * hs;
    post_att_ = p; p += L * D;
    post_ffn_ = p; p += L * D;
  }
  x_.resize(D); xb_.resize(D); q_.resize(QD); k_.resize(KV); v_.resize(KV); att_out_.resize(QD);
  hb_.resize(Hd); hb2_.resize(Hd); logits_.resize(V);
  // The exact cache grows with the positions fed (forward), not to seq_len up front: a version 1/2
  // header's seq_len is not tied to the file size, and a damaged one must not allocate terabytes.
  key_cache_.assign(L * cfg_.n_kv_heads, MatD(0, hs));
  value_cache_.assign(L * cfg_.n_kv_heads, MatD(0, hs));
}

const std::vector<float>& LlamaModel::forward(int token, int pos,
                                              const std::function<void(int, const LayerTrace&)>& trace) {
  const int D = cfg_.dim, Hd = cfg_.hidden_dim, KV = cfg_.kv_dim(), hs = cfg_.head_dim(), QD = cfg_.q_dim();
  const int S = cfg_.seq_len, G = cfg_.n_heads / cfg_.n_kv_heads;
  if (token < 0 || token >= cfg_.vocab_size) throw Error(path_ + ": token id " + std::to_string(token) + " out of range");
  if (pos < 0 || pos >= S)
    throw Error(path_ + ": position " + std::to_string(pos) + " is beyond the model's seq_len " + std::to_string(S));
  for (int i = 0; i < D; ++i) x_[i] = emb_[int64_t(token) * D + i] * float(cfg_.embed_scale);
  const double scale = cfg_.attn_scale();
  for (int l = 0; l < cfg_.n_layers; ++l) {
    rmsnorm(xb_.data(), x_.data(), rms_att_ + int64_t(l) * D, D, cfg_.rms_eps);
    matvec(q_.data(), wq_ + int64_t(l) * QD * D, xb_.data(), QD, D);
    matvec(k_.data(), wk_ + int64_t(l) * D * KV, xb_.data(), KV, D);
    matvec(v_.data(), wv_ + int64_t(l) * D * KV, xb_.data(), KV, D);
    if (cfg_.qk_norm) {
      rmsnorm_heads(q_.data(), QD, hs, q_norm_ + int64_t(l) * hs, cfg_.rms_eps);
      rmsnorm_heads(k_.data(), KV, hs, k_norm_ + int64_t(l) * hs, cfg_.rms_eps);
    }
    rope(q_.data(), QD, hs, pos, cfg_.layer_rope_theta(l), cfg_.rope_halves);
    rope(k_.data(), KV, hs, pos, cfg_.layer_rope_theta(l), cfg_.rope_halves);
    if (override_) {
      override_->attend(l, pos, q_.data(), k_.data(), v_.data(), att_out_.data());
    } else {
      for (int h = 0; h < cfg_.n_kv_heads; ++h) {
        const size_t c = size_t(l) * cfg_.n_kv_heads + h;
        if (pos >= key_cache_[c].rows()) {
          const Eigen::Index rows = std::min<Eigen::Index>(S, std::max<Eigen::Index>({64, 2 * key_cache_[c].rows(), pos + 1}));
          key_cache_[c].conservativeResize(rows, hs);
          value_cache_[c].conservativeResize(rows, hs);
        }
        key_cache_[c].row(pos) = Eigen::Map<const VecF>(k_.data() + h * hs, hs).cast<double>().transpose();
        value_cache_[c].row(pos) = Eigen::Map<const VecF>(v_.data() + h * hs, hs).cast<double>().transpose();
      }
      VecD z;
      double log_sum;
      const int w = cfg_.layer_window(l), lo = w > 0 ? std::max(0, pos - w + 1) : 0;  // a local layer's first key
      for (int h = 0; h < cfg_.n_heads; ++h) {
        const size_t c = size_t(l) * cfg_.n_kv_heads + h / G;
        const VecD q = Eigen::Map<const VecF>(q_.data() + h * hs, hs).cast<double>() * scale;
        if (lo == 0) {
          attend_cached(key_cache_[c], value_cache_[c], pos + 1, q, z, log_sum);
        } else {
          const MatD kw = key_cache_[c].middleRows(lo, pos + 1 - lo), vw = value_cache_[c].middleRows(lo, pos + 1 - lo);
          attend_cached(kw, vw, pos + 1 - lo, q, z, log_sum);
        }
        Eigen::Map<VecF>(att_out_.data() + h * hs, hs) = z.cast<float>();
      }
    }
    if (trace) trace(l, LayerTrace{q_.data(), k_.data(), v_.data(), att_out_.data()});
    matvec(xb_.data(), wo_ + int64_t(l) * D * QD, att_out_.data(), D, QD);
    if (post_att_) rmsnorm(xb_.data(), xb_.data(), post_att_ + int64_t(l) * D, D, cfg_.rms_eps);
    for (int i = 0; i < D; ++i) x_[i] += xb_[i];
    rmsnorm(xb_.data(), x_.data(), rms_ffn_ + int64_t(l) * D, D, cfg_.rms_eps);
    matvec(hb_.data(), w1_ + int64_t(l) * D * Hd, xb_.data(), Hd, D);
    matvec(hb2_.data(), w3_ + int64_t(l) * D * Hd, xb_.data(), Hd, D);
    for (int i = 0; i < Hd; ++i) {
      float a = hb_[i];
      hb_[i] = (cfg_.gelu_tanh ? gelu_tanh(a) : a / (1.0f + std::exp(-a))) * hb2_[i];
    }
    matvec(xb_.data(), w2_ + int64_t(l) * D * Hd, hb_.data(), D, Hd);
    if (post_ffn_) rmsnorm(xb_.data(), xb_.data(), post_ffn_ + int64_t(l) * D, D, cfg_.rms_eps);
    for (int i = 0; i < D; ++i) x_[i] += xb_[i];
  }
  rmsnorm(x_.data(), x_.data(), rms_final_, D, cfg_.rms_eps);
  matvec(logits_.data(), wcls_, x_.data(), cfg_.vocab_size, D);
  return logits_;
}

}  // namespace kvsim

namespace kvsim {
namespace {

/// Runs fn(begin, end) over `threads` contiguous chunks of [0, n).
void parallel_rows(int64_t n, int threads, const std::function<void(int64_t, int64_t)>& fn);

/// Runs fn(begin, end) over the fixed blocks [0, 256), [256, 512), … of [0, n), handed to `threads`
/// threads in turn: where a block starts never depends on the thread count, so neither does a row's
/// rounding (an SGEMM's result for a row can depend on the rows it is called with; Eigen's vectorized
/// exp and its scalar tail differ in the last bit). The batched prefill's GEMMs and element-wise
/// passes run this way, so `kvsim record --threads 1` and `--threads 2` write the same bits.
void parallel_blocks(int64_t n, int threads, const std::function<void(int64_t, int64_t)>& fn) {
  const int64_t B = 256, blocks = (n + B - 1) / B;
  std::atomic<int64_t> next{0};
  parallel_rows(std::min<int64_t>(threads, blocks), threads, [&](int64_t, int64_t) {
    for (int64_t b; (b = next.fetch_add(1)) < blocks;) fn(b * B, std::min(n, (b + 1) * B));
  });
}

void parallel_rows(int64_t n, int threads, const std::function<void(int64_t, int64_t)>& fn) {
  threads = int(std::max<int64_t>(1, std::min<int64_t>(threads, n)));
  if (threads == 1) return fn(0, n);
  std::vector<std::thread> pool;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(threads));
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      try {
        fn(n * t / threads, n * (t + 1) / threads);
      } catch (...) {
        errors[size_t(t)] = std::current_exception();
      }
    });
  for (auto& th : pool) th.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

/// Y[n, rows] = X[n, cols] · W^T for W [rows, cols] row-major (a linear layer over all positions), by
/// kvsim::gemm_abt (OpenBLAS's SGEMM where the build links it: 1.3× Eigen's here). The positions go in
/// fixed blocks of 256 rows handed out in turn, so a row's rounding depends on n, never on the thread
/// count (an SGEMM's result for a row can depend on how many rows it is called with): a recording made
/// with --threads 1 equals one made with --threads 2 to the bit.
void linear(MatF& Y, const MatF& X, const float* W, int64_t rows, int64_t cols, int threads) {
  Y.resize(X.rows(), rows);
  Eigen::Map<const MatF> Wm(W, rows, cols);
  parallel_blocks(X.rows(), threads, [&](int64_t a, int64_t b) { gemm_abt(X.middleRows(a, b - a), Wm, Y.middleRows(a, b - a)); });
}

/// Causal attention of every query head over all positions: A[:, h·hd…] = softmax(q kᵀ · scale) v,
/// over keys t − window + 1 … t when window > 0 (a local layer), else 0 … t.
void causal_attention(const MatF& Q, const MatF& K, const MatF& V, MatF& A, int H, int KVH, int hd, double scale_d,
                      int window, int threads) {
  const int64_t n = Q.rows();
  const int64_t B = 128, blocks = (n + B - 1) / B;
  const int G = H / KVH;
  const float scale = float(scale_d);
  A.resize(n, int64_t(H) * hd);
  std::atomic<int64_t> next{0};
  // Work items (head, query block), largest (last) blocks first so the threads finish together.
  parallel_rows(threads, threads, [&](int64_t, int64_t) {
    MatF S;
    for (int64_t item; (item = next.fetch_add(1)) < int64_t(H) * blocks;) {
      const int h = int(item % H);
      const int64_t r0 = (blocks - 1 - item / H) * B, rows = std::min(B, n - r0), keys = r0 + rows;
      const int g = h / G;
      const int64_t k0 = window > 0 ? std::max<int64_t>(0, r0 - window + 1) : 0;  // the block's first key
      S.noalias() = Q.block(r0, int64_t(h) * hd, rows, hd) * K.block(k0, int64_t(g) * hd, keys - k0, hd).transpose();
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t t = r0 + i, lo = (window > 0 ? std::max<int64_t>(0, t - window + 1) : 0) - k0, visible = t + 1 - k0 - lo;
        auto s = S.row(i).segment(lo, visible).array();
        const float mx = s.maxCoeff() * scale;  // scale > 0
        s = (s * scale - mx).exp();            // Eigen's vectorized exp
        s *= float(1.0 / double(s.template cast<double>().sum()));
        S.row(i).head(lo).setZero();
        S.row(i).tail(keys - k0 - lo - visible).setZero();
      }
      A.block(r0, int64_t(h) * hd, rows, hd).noalias() = S * V.block(k0, int64_t(g) * hd, keys - k0, hd);
    }
  });
}

/// Y[B, rows] = X[B, cols] · W^T with the threads splitting W's rows (the output features): a
/// decode step's GEMM has few rows of X, so each thread reads its own contiguous share of W.
void linear_features(MatF& Y, const MatF& X, const float* W, int64_t rows, int64_t cols, int threads) {
  Y.resize(X.rows(), rows);
  Eigen::Map<const MatF> Wm(W, rows, cols);
  parallel_rows(rows, threads, [&](int64_t a, int64_t b) { gemm_abt(X, Wm.middleRows(a, b - a), Y.middleCols(a, b - a)); });
}

}  // namespace

void LlamaModel::decode_step(const std::vector<int>& tokens, int pos, const std::vector<KVAttention*>& attn, int threads,
                             MatF& logits) const {
  const int D = cfg_.dim, F = cfg_.hidden_dim, KV = cfg_.kv_dim(), hd = cfg_.head_dim(), QD = cfg_.q_dim();
  const int64_t B = int64_t(tokens.size());
  if (attn.size() != tokens.size()) throw Error("decode_step: " + std::to_string(B) + " tokens but " + std::to_string(attn.size()) + " attentions");
  if (pos < 0 || pos >= cfg_.seq_len)
    throw Error(path_ + ": position " + std::to_string(pos) + " is beyond the model's seq_len " + std::to_string(cfg_.seq_len));
  threads = std::max(1, threads);
  MatF X(B, D), XB(B, D), Q, K, V, A(B, QD), O, H1, H3;
  for (int64_t b = 0; b < B; ++b) {
    const int tok = tokens[size_t(b)];
    if (tok < 0 || tok >= cfg_.vocab_size) throw Error(path_ + ": token id " + std::to_string(tok) + " out of range");
    if (!attn[size_t(b)]) throw Error("decode_step: sequence " + std::to_string(b) + " has no attention");
    X.row(b) = Eigen::Map<const Eigen::RowVectorXf>(emb_ + int64_t(tok) * D, D) * float(cfg_.embed_scale);
  }
  // The rotary angles at `pos`, once per RoPE base (Gemma 3: local layers use rope_theta_local).
  auto angles = [&](double theta) {
    std::pair<std::vector<float>, std::vector<float>> a{std::vector<float>(size_t(hd / 2)), std::vector<float>(size_t(hd / 2))};
    rope_angles(pos, theta, hd, a.first.data(), a.second.data());
    return a;
  };
  const auto global_angles = angles(cfg_.rope_theta), local_angles = angles(cfg_.rope_theta_local);
  auto norm_rows = [&](MatF& out, const MatF& in, const float* w) {
    for (int64_t b = 0; b < B; ++b) rmsnorm(out.row(b).data(), in.row(b).data(), w, int(in.cols()), cfg_.rms_eps);
  };
  std::atomic<int64_t> next{0};
  for (int l = 0; l < cfg_.n_layers; ++l) {
    norm_rows(XB, X, rms_att_ + int64_t(l) * D);
    linear_features(Q, XB, wq_ + int64_t(l) * QD * D, QD, D, threads);
    linear_features(K, XB, wk_ + int64_t(l) * D * KV, KV, D, threads);
    linear_features(V, XB, wv_ + int64_t(l) * D * KV, KV, D, threads);
    const auto& [cs, sn] = cfg_.layer_rope_theta(l) != cfg_.rope_theta ? local_angles : global_angles;
    for (int64_t b = 0; b < B; ++b) {
      if (q_norm_) {
        rmsnorm_heads(Q.row(b).data(), QD, hd, q_norm_ + int64_t(l) * hd, cfg_.rms_eps);
        rmsnorm_heads(K.row(b).data(), KV, hd, k_norm_ + int64_t(l) * hd, cfg_.rms_eps);
      }
      rope_rows(Q.row(b).data(), QD, hd, cs.data(), sn.data(), cfg_.rope_halves);
      rope_rows(K.row(b).data(), KV, hd, cs.data(), sn.data(), cfg_.rope_halves);
    }
    next = 0;  // each sequence's attention on one thread, sequences handed out in turn
    parallel_rows(threads, threads, [&](int64_t, int64_t) {
      for (int64_t b; (b = next.fetch_add(1)) < B;)
        attn[size_t(b)]->attend(l, pos, Q.row(b).data(), K.row(b).data(), V.row(b).data(), A.row(b).data());
    });
    linear_features(O, A, wo_ + int64_t(l) * D * QD, D, QD, threads);
    if (post_att_) norm_rows(O, O, post_att_ + int64_t(l) * D);
    X += O;
    norm_rows(XB, X, rms_ffn_ + int64_t(l) * D);
    linear_features(H1, XB, w1_ + int64_t(l) * D * F, F, D, threads);
    linear_features(H3, XB, w3_ + int64_t(l) * D * F, F, D, threads);
    auto g = H1.array();  // SwiGLU (Eigen's vectorized exp) or GeGLU, as prefill()
    if (cfg_.gelu_tanh) g = g.unaryExpr([](float x) { return gelu_tanh(x); }) * H3.array();
    else g = g / (1.0f + (-g).exp()) * H3.array();
    linear_features(O, H1, w2_ + int64_t(l) * D * F, D, F, threads);
    if (post_ffn_) norm_rows(O, O, post_ffn_ + int64_t(l) * D);
    X += O;
  }
  norm_rows(XB, X, rms_final_);
  linear_features(logits, XB, wcls_, cfg_.vocab_size, D, threads);
}

void LlamaModel::prefill(const std::vector<int>& tokens, int threads,
                         const std::function<void(int, const MatF&, const MatF&, const MatF&, const MatF&)>& on_layer,
                         const std::function<void(int, const MatF&)>& on_logits) const {
  const int D = cfg_.dim, F = cfg_.hidden_dim, KV = cfg_.kv_dim(), hd = cfg_.head_dim(), QD = cfg_.q_dim();
  const int64_t n = int64_t(tokens.size());
  if (n > cfg_.seq_len)
    throw Error(path_ + ": " + std::to_string(n) + " positions requested but the model's seq_len is " + std::to_string(cfg_.seq_len));
  threads = std::max(1, threads);
  MatF X(n, D), XB(n, D), Q, K, V, A, O, H1, H3;
  for (int64_t t = 0; t < n; ++t) {
    const int tok = tokens[size_t(t)];
    if (tok < 0 || tok >= cfg_.vocab_size) throw Error(path_ + ": token id " + std::to_string(tok) + " out of range");
    X.row(t) = Eigen::Map<const Eigen::RowVectorXf>(emb_ + int64_t(tok) * D, D) * float(cfg_.embed_scale);
  }
  // Rotary angles once per position and RoPE base (the one-token path's double-precision formula, cast to float).
  std::vector<double> thetas = {cfg_.rope_theta};
  if (cfg_.sliding_window > 0 && cfg_.rope_theta_local != cfg_.rope_theta) thetas.push_back(cfg_.rope_theta_local);
  std::vector<MatF> cos_t(thetas.size(), MatF(n, hd / 2)), sin_t(thetas.size(), MatF(n, hd / 2));
  for (size_t b = 0; b < thetas.size(); ++b)
    parallel_rows(n, threads, [&](int64_t a0, int64_t a1) {
      for (int64_t t = a0; t < a1; ++t) rope_angles(t, thetas[b], hd, cos_t[b].row(t).data(), sin_t[b].row(t).data());
    });
  auto norm_rows = [&](MatF& out, const MatF& in, const float* w) {
    parallel_rows(n, threads, [&](int64_t a, int64_t b) {
      for (int64_t t = a; t < b; ++t) rmsnorm(out.row(t).data(), in.row(t).data(), w, int(in.cols()), cfg_.rms_eps);
    });
  };
  for (int l = 0; l < cfg_.n_layers; ++l) {
    norm_rows(XB, X, rms_att_ + int64_t(l) * D);
    linear(Q, XB, wq_ + int64_t(l) * QD * D, QD, D, threads);
    linear(K, XB, wk_ + int64_t(l) * D * KV, KV, D, threads);
    linear(V, XB, wv_ + int64_t(l) * D * KV, KV, D, threads);
    const size_t b = thetas.size() > 1 && cfg_.layer_window(l) > 0 ? 1 : 0;
    parallel_rows(n, threads, [&](int64_t a0, int64_t a1) {
      for (int64_t t = a0; t < a1; ++t) {
        if (q_norm_) {
          rmsnorm_heads(Q.row(t).data(), QD, hd, q_norm_ + int64_t(l) * hd, cfg_.rms_eps);
          rmsnorm_heads(K.row(t).data(), KV, hd, k_norm_ + int64_t(l) * hd, cfg_.rms_eps);
        }
        rope_rows(Q.row(t).data(), QD, hd, cos_t[b].row(t).data(), sin_t[b].row(t).data(), cfg_.rope_halves);
        rope_rows(K.row(t).data(), KV, hd, cos_t[b].row(t).data(), sin_t[b].row(t).data(), cfg_.rope_halves);
      }
    });
    causal_attention(Q, K, V, A, cfg_.n_heads, cfg_.n_kv_heads, hd, cfg_.attn_scale(), cfg_.layer_window(l), threads);
    if (on_layer) on_layer(l, Q, K, V, A);
    linear(O, A, wo_ + int64_t(l) * D * QD, D, QD, threads);
    if (post_att_) norm_rows(O, O, post_att_ + int64_t(l) * D);
    X += O;
    norm_rows(XB, X, rms_ffn_ + int64_t(l) * D);
    linear(H1, XB, w1_ + int64_t(l) * D * F, F, D, threads);
    linear(H3, XB, w3_ + int64_t(l) * D * F, F, D, threads);
    parallel_blocks(n, threads, [&](int64_t a, int64_t b2) {  // SwiGLU (Eigen's vectorized exp) or GeGLU
      auto g = H1.middleRows(a, b2 - a).array();
      if (cfg_.gelu_tanh) g = g.unaryExpr([](float x) { return gelu_tanh(x); }) * H3.middleRows(a, b2 - a).array();
      else g = g / (1.0f + (-g).exp()) * H3.middleRows(a, b2 - a).array();
    });
    linear(O, H1, w2_ + int64_t(l) * D * F, D, F, threads);
    if (post_ffn_) norm_rows(O, O, post_ffn_ + int64_t(l) * D);
    X += O;
  }
  norm_rows(XB, X, rms_final_);
  MatF Lb;
  for (int64_t r0 = 0; r0 < n; r0 += 256) {
    const int64_t rows = std::min<int64_t>(256, n - r0);
    MatF xb = XB.middleRows(r0, rows);
    linear(Lb, xb, wcls_, cfg_.vocab_size, D, threads);
    if (on_logits) on_logits(int(r0), Lb);
  }
}

}  // namespace kvsim
