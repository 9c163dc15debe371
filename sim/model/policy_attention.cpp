#include "kvsim/model/policy_attention.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kvsim/core/error.hpp"
#include "kvsim/core/rng.hpp"

namespace kvsim {

StreamInfo model_cache_stream(const LlamaConfig& cfg, int layer, int kv_head, int64_t n_tokens, GqaMode gqa,
                              GroupAgg group_agg, int64_t prefill, bool policy_f32) {
  StreamInfo info;
  info.n = n_tokens;
  info.head_dim = cfg.head_dim();
  info.n_queries = gqa == GqaMode::query_head ? 1 : cfg.n_heads / cfg.n_kv_heads;
  info.group_agg = group_agg;
  info.prefill = prefill;
  info.policy_f32 = policy_f32;  // `[eval] policy_precision = "float32"`, as in the replay
  // The caches receive post-RoPE keys and queries scaled by attn_scale(), as a recording of this model
  // says (model_recording_meta): expected_attention turns the queries back before RoPE with these.
  info.softmax_scale = cfg.attn_scale();
  info.rope_applied = true;
  info.rope_halves = cfg.rope_halves;
  info.rope_theta = cfg.layer_rope_theta(layer);
  info.layer = layer;
  info.kv_head = kv_head;
  info.n_layers = cfg.n_layers;
  info.n_kv_heads = cfg.n_kv_heads;
  // Policies manage the global layers only (local ones keep their exact window): this layer's rank among them.
  info.managed_layer = info.n_managed_layers = 0;
  for (int l = 0; l < cfg.n_layers; ++l) {
    info.managed_layer += l < layer && cfg.layer_window(l) == 0;
    info.n_managed_layers += cfg.layer_window(l) == 0;
  }
  return info;
}

PolicyKVAttention::PolicyKVAttention(const LlamaConfig& cfg, const PolicySpec& spec, int64_t n_tokens, uint64_t seed,
                                     GqaMode gqa, GroupAgg group_agg, int64_t prefill, bool policy_f32,
                                     int64_t prompt_block)
    : cfg_(cfg), per_query_(gqa == GqaMode::query_head), prefill_(prefill), prompt_block_(prompt_block) {
  if (prefill < 0 || prefill >= n_tokens)
    throw Error("model.prefill (" + std::to_string(prefill) + ") must be in [0, model.tokens = " + std::to_string(n_tokens) + ")");
  const int G = cfg.n_heads / cfg.n_kv_heads;
  const int caches = per_query_ ? cfg.n_heads : cfg.n_kv_heads;
  window_.resize(size_t(cfg.n_layers) * cfg.n_kv_heads);
  for (int l = 0; l < cfg.n_layers; ++l)
    for (int h = 0; h < caches; ++h) {
      if (const int w = cfg.layer_window(l); w > 0) {  // a local layer: exact over its window, no policy
        pol_.push_back(nullptr);
        if (h < cfg.n_kv_heads) window_[size_t(l) * cfg.n_kv_heads + h] = Window{MatD::Zero(w, cfg.head_dim()), MatD::Zero(w, cfg.head_dim())};
        continue;
      }
      StreamInfo info = model_cache_stream(cfg, l, per_query_ ? h / G : h, n_tokens, gqa, group_agg, prefill, policy_f32);
      const uint64_t head_id = per_query_ ? uint64_t(h) : uint64_t(h) + (1ULL << 32);
      info.seed = derive_seed({seed, uint64_t(l), head_id, 0, 0});
      auto p = make_policy(spec.name, spec.params, info);
      if (needs_exact_probs(*p) || needs_global_scores(*p))
        throw Error("policy '" + spec.label + "' is a non-causal oracle (it needs future or exact attention) and cannot run in a closed loop");
      pol_.push_back(std::move(p));
    }
  answers_.resize(per_query_ ? 1 : G);
}

void PolicyKVAttention::attend_prompt(int layer, int pos, const float* q, const float* k, const float* v, float* out) {
  const int hs = cfg_.head_dim(), G = cfg_.n_heads / cfg_.n_kv_heads, w = cfg_.layer_window(layer);
  if (prompt_.P == 0) {  // the buffer, on the prompt's first position: a cache given load_prompt never holds it
    // (queries in double, keys and values in float, for every layer: 184 KB a token for Gemma 3, 6 GB at 32k).
    prompt_.P = prefill_;
    prompt_.k.assign(size_t(cfg_.n_layers) * cfg_.n_kv_heads, MatF::Zero(prefill_, hs));
    prompt_.v = prompt_.k;
    prompt_.q.assign(size_t(cfg_.n_layers) * cfg_.n_heads, MatD::Zero(prefill_, hs));
  }
  const int lo = w > 0 ? std::max(0, pos - w + 1) : 0;  // a local layer's first visible key
  const double scale = cfg_.attn_scale();
  for (int kvh = 0; kvh < cfg_.n_kv_heads; ++kvh) {
    MatF& K = prompt_.k[size_t(layer) * cfg_.n_kv_heads + kvh];
    MatF& V = prompt_.v[size_t(layer) * cfg_.n_kv_heads + kvh];
    K.row(pos) = Eigen::Map<const VecF>(k + kvh * hs, hs).transpose();
    V.row(pos) = Eigen::Map<const VecF>(v + kvh * hs, hs).transpose();
    const MatD Kd = K.middleRows(lo, pos + 1 - lo).cast<double>(), Vd = V.middleRows(lo, pos + 1 - lo).cast<double>();
    for (int g = 0; g < G; ++g) {  // exact causal attention of each query head of the group
      const int h = kvh * G + g;
      MatD& Q = prompt_.q[size_t(layer) * cfg_.n_heads + h];
      Q.row(pos) = Eigen::Map<const VecF>(q + h * hs, hs).cast<double>().transpose() * scale;
      VecD z;
      double ls;
      attend_cached(Kd, Vd, pos + 1 - lo, Q.row(pos).transpose(), z, ls);
      Eigen::Map<VecF>(out + h * hs, hs) = z.cast<float>();
    }
  }
  if (pos + 1 == prefill_) prefill_layer(layer, prompt_);  // the prompt's end: every cache compresses it at once
}

void PolicyKVAttention::prefill_layer(int layer, const PromptTensors& prompt) {
  const int G = cfg_.n_heads / cfg_.n_kv_heads, caches = per_query_ ? cfg_.n_heads : cfg_.n_kv_heads;
  if (const int64_t w = cfg_.layer_window(layer); w > 0) {  // the window's ring: the prompt's last w tokens
    for (int kvh = 0; kvh < cfg_.n_kv_heads; ++kvh) {
      const size_t kv = size_t(layer) * cfg_.n_kv_heads + kvh;
      const int64_t lo = std::max<int64_t>(0, prefill_ - w), off = prefill_ - prompt.k[kv].rows();  // rows from `off`
      if (off > lo || prompt.v[kv].rows() != prompt.k[kv].rows())
        throw Error("load_prompt: local layer " + std::to_string(layer) + " holds " + std::to_string(prompt.k[kv].rows()) +
                    " key rows, not the prompt's last " + std::to_string(prefill_ - lo));
      for (int64_t j = lo; j < prefill_; ++j) {
        window_[kv].k.row(j % w) = prompt.k[kv].row(j - off).cast<double>();
        window_[kv].v.row(j % w) = prompt.v[kv].row(j - off).cast<double>();
      }
    }
    return;
  }
  for (int c = 0; c < caches; ++c) {
    const int kvh = per_query_ ? c / G : c, first = per_query_ ? c : c * G, count = per_query_ ? 1 : G;
    std::vector<const MatD*> qs;
    for (int g = 0; g < count; ++g) qs.push_back(&prompt.q[size_t(layer) * cfg_.n_heads + first + g]);
    const size_t kv = size_t(layer) * cfg_.n_kv_heads + kvh;
    // Blocked stepping: blocks sized for a cache of at most the prompt's tokens.
    const int64_t block = prompt_block_ < 0 ? stepping_block_size(prefill_, count) : prompt_block_;
    kvsim::prefill(*pol_[size_t(layer) * caches + c], prefill_, prompt.k[kv], prompt.v[kv], qs, block);
  }
}

PromptTensors prompt_tensors(const LlamaModel& model, const std::vector<int>& prompt, int threads) {
  const auto& cfg = model.config();
  if (prompt.empty()) throw Error("prompt_tensors: empty prompt");
  const int hd = cfg.head_dim();
  const double scale = cfg.attn_scale();
  PromptTensors pt;
  pt.P = int64_t(prompt.size());
  pt.k.resize(size_t(cfg.n_layers) * cfg.n_kv_heads);
  pt.v.resize(pt.k.size());
  pt.q.resize(size_t(cfg.n_layers) * cfg.n_heads);
  auto on_layer = [&](int l, const MatF& Q, const MatF& K, const MatF& V, const MatF&) {
    for (int h = 0; h < cfg.n_kv_heads; ++h) {
      pt.k[size_t(l) * cfg.n_kv_heads + h] = K.middleCols(int64_t(h) * hd, hd);
      pt.v[size_t(l) * cfg.n_kv_heads + h] = V.middleCols(int64_t(h) * hd, hd);
    }
    if (cfg.layer_window(l) > 0) return;  // a local layer's window reads no query (PromptTensors::q)
    for (int h = 0; h < cfg.n_heads; ++h)
      pt.q[size_t(l) * cfg.n_heads + h] = Q.middleCols(int64_t(h) * hd, hd).cast<double>() * scale;
  };
  auto on_logits = [&](int row0, const MatF& L) {
    if (row0 + L.rows() == pt.P) pt.last_logits.assign(L.row(L.rows() - 1).data(), L.row(L.rows() - 1).data() + L.cols());
  };
  model.prefill(prompt, threads, on_layer, on_logits);
  return pt;
}

void PolicyKVAttention::load_prompt(const PromptTensors& prompt) {
  if (prompt.P != prefill_)
    throw Error("load_prompt: a " + std::to_string(prompt.P) + "-token prompt for caches built with prefill = " + std::to_string(prefill_));
  for (int l = 0; l < cfg_.n_layers; ++l) prefill_layer(l, prompt);
  prompt_ = PromptTensors{};  // the per-token prompt buffer is not needed any more
  loaded_ = true;
}

void PolicyKVAttention::attend(int layer, int pos, const float* q, const float* k, const float* v, float* out) {
  if (pos < prefill_) {
    if (loaded_) throw Error("PolicyKVAttention: position " + std::to_string(pos) + " is inside the prompt that load_prompt gave");
    return attend_prompt(layer, pos, q, k, v, out);
  }
  const int hs = cfg_.head_dim(), G = cfg_.n_heads / cfg_.n_kv_heads;
  const double scale = cfg_.attn_scale();
  if (const int w = cfg_.layer_window(layer); w > 0) {  // a local layer: exact attention over its last w tokens
    for (int kvh = 0; kvh < cfg_.n_kv_heads; ++kvh) {
      Window& win = window_[size_t(layer) * cfg_.n_kv_heads + kvh];
      win.k.row(pos % w) = Eigen::Map<const VecF>(k + kvh * hs, hs).cast<double>().transpose();
      win.v.row(pos % w) = Eigen::Map<const VecF>(v + kvh * hs, hs).cast<double>().transpose();
      for (int g = 0; g < G; ++g) {
        const int h = kvh * G + g;
        const VecD qh = Eigen::Map<const VecF>(q + h * hs, hs).cast<double>() * scale;
        VecD z;
        double ls;
        attend_cached(win.k, win.v, std::min(pos + 1, w), qh, z, ls);  // the ring's order does not matter
        Eigen::Map<VecF>(out + h * hs, hs) = z.cast<float>();
      }
    }
    return;
  }
  const int caches = per_query_ ? cfg_.n_heads : cfg_.n_kv_heads;
  for (int c = 0; c < caches; ++c) {
    Policy& p = *pol_[size_t(layer) * caches + c];
    const int kvh = per_query_ ? c / G : c;
    p.observe(pos, k + kvh * hs, v + kvh * hs);
    const int first = per_query_ ? c : c * G, count = per_query_ ? 1 : G;
    MatD Q(count, hs);
    for (int g = 0; g < count; ++g)
      Q.row(g) = Eigen::Map<const VecF>(q + (first + g) * hs, hs).cast<double>().transpose() * scale;
    answers_.assign(count, Answer{});
    p.attend(pos + 1, Q, &answers_, nullptr);
    for (int g = 0; g < count; ++g) Eigen::Map<VecF>(out + (first + g) * hs, hs) = answers_[g].z.cast<float>();
  }
}

double PolicyKVAttention::mean_cache_tokens() const {
  double s = 0;
  int64_t n = 0;
  for (const auto& p : pol_)
    if (p) s += double(p->cache_tokens()), ++n;
  return n ? s / double(n) : std::numeric_limits<double>::quiet_NaN();
}

void GuardedAttention::attend(int layer, int pos, const float* q, const float* k, const float* v, float* out) {
  if (broken_.empty()) {
    try {
      return a_->attend(layer, pos, q, k, v, out);
    } catch (const Error& e) {
      if (std::string(e.what()).find("non-finite") == std::string::npos) throw;
      broken_ = e.what();
    }
  }
  std::fill(out, out + out_size_, 0.0f);
}

std::vector<std::vector<int>> batched_greedy(const LlamaModel& model, const std::vector<int>& prompt, int start, int total,
                                             const std::vector<float>* last_logits, const std::vector<KVAttention*>& attn,
                                             int threads) {
  const size_t B = attn.size();
  std::vector<std::vector<int>> seq(B, prompt);
  if (last_logits) {
    if (start != int(prompt.size())) throw Error("batched_greedy: last_logits needs start = the prompt's length");
    const int first = int(std::max_element(last_logits->begin(), last_logits->end()) - last_logits->begin());
    for (auto& s : seq) s.push_back(first);
  }
  MatF logits;
  std::vector<int> tok(B);
  for (int pos = start; pos + 1 < total; ++pos) {
    for (size_t b = 0; b < B; ++b) tok[b] = seq[b][size_t(pos)];
    model.decode_step(tok, pos, attn, threads, logits);
    if (pos + 1 < int(prompt.size())) continue;
    for (size_t b = 0; b < B; ++b) {
      const float* r = logits.row(Eigen::Index(b)).data();
      seq[b].push_back(int(std::max_element(r, r + logits.cols()) - r));
    }
  }
  return seq;
}

double teacher_forced_ce(LlamaModel& model, const std::vector<int>& tokens, KVAttention* attn, int from) {
  model.set_attention(attn);
  std::vector<float> ce;
  for (size_t pos = 0; pos + 1 < tokens.size(); ++pos) {
    const auto& logits = model.forward(tokens[pos], int(pos));
    if (int(pos) >= from) ce.push_back(token_cross_entropy(logits, tokens[pos + 1]));
  }
  model.set_attention(nullptr);
  return mean_of(ce);
}

std::vector<int> greedy_tokens(LlamaModel& model, const std::vector<int>& prompt, int total, KVAttention* attn) {
  model.set_attention(attn);
  std::vector<int> out(prompt);
  for (int pos = 0; pos < total - 1; ++pos) {
    const auto& logits = model.forward(out[pos], pos);
    if (pos + 1 < int(out.size())) continue;
    out.push_back(int(std::max_element(logits.begin(), logits.end()) - logits.begin()));
  }
  model.set_attention(nullptr);
  return out;
}

}  // namespace kvsim
