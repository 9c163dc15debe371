#include "kvsim/model/record.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>
#include <filesystem>
#include <cmath>
#include <fstream>
#include <memory>
#include <sstream>

#include "kvsim/model/policy_attention.hpp"
#include "kvsim/core/error.hpp"
#include "kvsim/model/gguf.hpp"
#include "kvsim/model/llama.hpp"
#include "kvsim/io/recording.hpp"
#include "kvsim/model/tokenizer.hpp"

namespace kvsim {

namespace {

/// Recorded tensors [layer][head] of [n, head_dim]: q and the model's attention output per query
/// head, k and v per KV head.
/// The whole text file at `path`; throws naming it when it cannot be opened.
std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot open text file");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Trace {
  std::vector<std::vector<MatF>> Q, A, K, V;
  Trace(int L, int H, int KVH, int n, int hs)
      : Q(L, std::vector<MatF>(H, MatF(n, hs))), A(L, std::vector<MatF>(H, MatF(n, hs))),
        K(L, std::vector<MatF>(KVH, MatF(n, hs))), V(L, std::vector<MatF>(KVH, MatF(n, hs))) {}
};

/// The text's windows of opt.tokens tokens (text_windows); throws naming the file.
std::vector<std::vector<int>> encode_text(const RecordOptions& opt, const Tokenizer& tok, int windows,
                                          std::vector<int64_t>* offsets = nullptr) {
  if (opt.text_path.empty()) throw Error("kvsim record: give --text FILE (teacher-forced) or --generate N");
  if (opt.tokens <= 1) throw Error("kvsim record: --tokens must be at least 2");
  return text_windows(opt.text_path, tok, opt.tokens, windows, opt.text_tail,
                      windows == 1 ? "--tokens" : "--tokens × --windows", offsets);
}

/// Runs the model over n positions (teacher-forced on `input`, or greedy after the prompt `input`),
/// filling `tr`, res.tokens, res.cross_entropy and res.text. Returns the positions recorded.
int run_positions(LlamaModel& model, const Tokenizer& tok, const std::vector<int>& input, int n, bool generate,
                  Trace& tr, RecordResult& res) {
  const auto& cfg = model.config();
  const int hs = cfg.head_dim(), H = cfg.n_heads, KVH = cfg.n_kv_heads;
  int pos = 0;
  int token = input[0];
  std::string text;
  for (; pos < n; ++pos) {
    res.tokens.push_back(token);
    const auto& logits = model.forward(token, pos, [&](int l, const LayerTrace& lt) {
      for (int h = 0; h < H; ++h) {
        tr.Q[l][h].row(pos) = Eigen::Map<const VecF>(lt.q + h * hs, hs).transpose();
        tr.A[l][h].row(pos) = Eigen::Map<const VecF>(lt.attn + h * hs, hs).transpose();
      }
      for (int h = 0; h < KVH; ++h) {
        tr.K[l][h].row(pos) = Eigen::Map<const VecF>(lt.k + h * hs, hs).transpose();
        tr.V[l][h].row(pos) = Eigen::Map<const VecF>(lt.v + h * hs, hs).transpose();
      }
    });
    int next;
    if (!generate) {
      next = input[std::min<size_t>(pos + 1, input.size() - 1)];
      if (pos + 1 < n) res.cross_entropy.push_back(token_cross_entropy(logits, next));
    } else if (pos + 1 < int(input.size())) {
      next = input[pos + 1];  // still inside the prompt
    } else {
      next = static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    }
    if (pos > 0 || token != tok.bos_id()) text += tok.decode(pos > 0 ? res.tokens[pos - 1] : -1, token);
    // llama2.c stops on BOS (a sequence boundary); a byte-level model trained with BOS at every
    // paragraph (Tokenizer::encode_document) goes on into the next paragraph; a GGUF model stops at
    // its end-of-sequence token.
    const int stop = model.config().gguf_version > 0 ? tok.eos_id() : tok.bos_id();
    if (generate && next == stop && !tok.byte_level()) {
      ++pos;
      break;
    }
    token = next;
  }
  // Text of the recorded tokens plus, in generation mode, the final predicted token.
  if (generate && pos == n) text += tok.decode(res.tokens.back(), token);
  res.text = text;
  return pos;
}

}  // namespace

std::vector<int> record_layers(const std::string& spec, const LlamaConfig& cfg) {
  std::vector<int> out;
  if (spec == "all" || spec == "global") {
    for (int l = 0; l < cfg.n_layers; ++l)
      if (spec == "all" || cfg.layer_window(l) == 0) out.push_back(l);
    if (out.empty()) throw Error("--layers global: the model has no global layer (every layer has a sliding window)");
    return out;
  }
  std::stringstream ss(spec);
  for (std::string item; std::getline(ss, item, ',');) {
    size_t used = 0;
    int l = -1;
    try {
      l = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size())
      throw Error("--layers '" + spec + "': '" + item + "' is not a layer index (give all, global or a list such as 5,11,17)");
    if (l < 0 || l >= cfg.n_layers)
      throw Error("--layers: layer " + std::to_string(l) + " is out of range [0, " + std::to_string(cfg.n_layers) + ")");
    out.push_back(l);
  }
  if (out.empty()) throw Error("--layers '" + spec + "': no layer given");
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

RecordingMeta model_recording_meta(const LlamaConfig& cfg, const std::string& model, const std::string& source,
                                   int64_t n_tokens) {
  RecordingMeta meta;
  meta.model = model;
  meta.source = source;
  meta.rope = "applied";
  meta.rope_theta = cfg.rope_theta;
  meta.rope_halves = cfg.rope_halves;
  meta.n_layers = cfg.n_layers;
  meta.n_heads = cfg.n_heads;
  meta.n_kv_heads = cfg.n_kv_heads;
  meta.head_dim = cfg.head_dim();
  meta.n_tokens = n_tokens;
  meta.softmax_scale = cfg.attn_scale();
  if (cfg.sliding_window > 0)
    for (int l = 0; l < cfg.n_layers; ++l) meta.layer_windows.push_back(cfg.layer_window(l));
  return meta;
}

namespace {

/// The recording's attributes for n_rec positions.
RecordingMeta recording_meta(const RecordOptions& opt, const LlamaConfig& cfg, int n_rec) {
  const bool generate = opt.generate > 0;
  std::ostringstream src;
  src << "kvsim record --checkpoint " << opt.checkpoint << (opt.tokenizer.empty() ? "" : " --tokenizer " + opt.tokenizer);
  if (!opt.policy.empty()) src << " --policy " << opt.policy << " (" << opt.policy_params.to_string() << ")";
  if (generate) src << " --generate " << opt.generate << (opt.prompt.empty() ? "" : " --prompt '" + opt.prompt + "'");
  else src << " --text " << opt.text_path << (opt.text_tail > 0 ? " --text-tail " + std::to_string(opt.text_tail) : "")
            << " --tokens " << opt.tokens;
  if (opt.layers != "all") src << " --layers " << opt.layers;
  RecordingMeta meta = model_recording_meta(cfg, opt.checkpoint, src.str(), n_rec);
  const auto layers = record_layers(opt.layers, cfg);
  if (int(layers.size()) == cfg.n_layers) return meta;
  // A layer subset, renumbered 0, 1, … (subset_layers, written by write_trailer, maps them back).
  meta.n_layers = int(layers.size());
  if (!meta.layer_windows.empty()) {
    std::vector<int64_t> w;
    for (int l : layers) w.push_back(meta.layer_windows[size_t(l)]);
    meta.layer_windows = std::any_of(w.begin(), w.end(), [](int64_t x) { return x > 0; }) ? w : std::vector<int64_t>{};
  }
  return meta;
}

/// Where model layer l goes in the recording (RecordOptions::layers): its index there, or -1.
std::vector<int> recorded_index(const RecordOptions& opt, const LlamaConfig& cfg) {
  std::vector<int> at(size_t(cfg.n_layers), -1);
  const auto layers = record_layers(opt.layers, cfg);
  for (size_t i = 0; i < layers.size(); ++i) at[size_t(layers[i])] = int(i);
  return at;
}

/// The exact text source of a teacher-forced recording: the file, its sha256, the held-out tail share
/// and the first token's index in that text's token stream (the stored tokens follow from these).
void write_text_source(RecordingWriter& w, const RecordOptions& opt) {
  const std::string text = read_text_file(opt.text_path);
  w.set_attr("text_file", opt.text_path);
  w.set_attr("text_sha256", gguf::hex_sha256(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
  w.set_attr("text_tail", opt.text_tail);
  w.set_attr("text_token_offset", opt.text_token_offset);
}

/// Tokens, cross-entropy and the model's attributes (everything but the tensors).
void write_trailer(RecordingWriter& w, const RecordOptions& opt, const LlamaConfig& cfg, const RecordResult& res) {
  const bool generate = opt.generate > 0;
  w.write_tokens(std::vector<int32_t>(res.tokens.begin(), res.tokens.end()));
  if (!res.cross_entropy.empty()) {
    w.write_cross_entropy(res.cross_entropy);
    w.set_attr("mean_cross_entropy", res.mean_cross_entropy);
  }
  w.set_attr("mode", std::string(generate ? "generate" : "teacher_forced"));
  if (!generate && !opt.text_path.empty()) write_text_source(w, opt);
  w.set_attr("forward", res.path_taken);
  const auto layers = record_layers(opt.layers, cfg);
  if (int(layers.size()) < cfg.n_layers) {
    w.set_attr("subset_layers", std::vector<int64_t>(layers.begin(), layers.end()));
    w.set_attr("model_n_layers", int64_t(cfg.n_layers));
  }
  w.set_attr("checkpoint_format", cfg.format_name());
  if (cfg.gguf_version > 0) {
    w.set_attr("architecture", cfg.architecture);
    w.set_attr("quantization", cfg.tensor_types);
    w.set_attr("checkpoint_sha256", cfg.sha256);
  }
  w.finish();
}

/// Writes the first n_rec positions of `tr` (and tokens, cross-entropy) in the recording schema.
void write_recording(const RecordOptions& opt, const LlamaConfig& cfg, const Trace& tr, int n_rec,
                     const RecordResult& res) {
  RecordingWriter w(opt.out, recording_meta(opt, cfg, n_rec), opt.with_attn, opt.deflate);
  const auto at = recorded_index(opt, cfg);
  for (int l = 0; l < cfg.n_layers; ++l) {
    const int r = at[size_t(l)];
    if (r < 0) continue;
    for (int h = 0; h < cfg.n_heads; ++h) {
      w.write(r, Tensor::q, h, tr.Q[l][h].topRows(n_rec));
      if (opt.with_attn) w.write(r, Tensor::attn, h, tr.A[l][h].topRows(n_rec));
    }
    for (int h = 0; h < cfg.n_kv_heads; ++h) {
      w.write(r, Tensor::k, h, tr.K[l][h].topRows(n_rec));
      w.write(r, Tensor::v, h, tr.V[l][h].topRows(n_rec));
    }
  }
  write_trailer(w, opt, cfg, res);
}

/// Teacher-forced recording through the batched prefill: each layer's tensors are written as the
/// layer is computed, so memory holds one layer's activations, not all of them.
RecordResult record_batched(const RecordOptions& opt, const LlamaModel& model, const Tokenizer& tok,
                            const std::vector<int>& input, int n) {
  const auto& cfg = model.config();
  const int hd = cfg.head_dim();
  RecordResult res;
  res.path_taken = "batched prefill";
  res.tokens.assign(input.begin(), input.begin() + n);
  std::unique_ptr<RecordingWriter> w;
  if (!opt.out.empty()) w = std::make_unique<RecordingWriter>(opt.out, recording_meta(opt, cfg, n), opt.with_attn, opt.deflate);
  const int threads = opt.threads > 0 ? opt.threads : int(std::max(1u, std::thread::hardware_concurrency()));
  res.cross_entropy.resize(size_t(n - 1));
  const auto at = recorded_index(opt, cfg);
  double write_s = 0;
  const auto t0 = std::chrono::steady_clock::now();
  model.prefill(
      res.tokens, threads,
      [&](int l, const MatF& Q, const MatF& K, const MatF& V, const MatF& A) {
        const int r = at[size_t(l)];
        if (!w || r < 0) return;
        const auto w0 = std::chrono::steady_clock::now();
        for (int h = 0; h < cfg.n_heads; ++h) {
          w->write(r, Tensor::q, h, Q.middleCols(int64_t(h) * hd, hd));
          if (opt.with_attn) w->write(r, Tensor::attn, h, A.middleCols(int64_t(h) * hd, hd));
        }
        for (int h = 0; h < cfg.n_kv_heads; ++h) {
          w->write(r, Tensor::k, h, K.middleCols(int64_t(h) * hd, hd));
          w->write(r, Tensor::v, h, V.middleCols(int64_t(h) * hd, hd));
        }
        write_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
      },
      [&](int r0, const MatF& L) {
        for (int64_t r = 0; r < L.rows() && r0 + r + 1 < n; ++r)
          res.cross_entropy[size_t(r0 + r)] = token_cross_entropy(L.row(r).data(), cfg.vocab_size, input[size_t(r0 + r + 1)]);
      });
  res.forward_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() - write_s;
  res.mean_cross_entropy = mean_of(res.cross_entropy);
  for (int t = 0; t < n; ++t) res.text += tok.decode(t > 0 ? res.tokens[size_t(t - 1)] : -1, res.tokens[size_t(t)]);
  if (w) write_trailer(*w, opt, cfg, res);
  return res;
}

}  // namespace

RecordResult record_model(const RecordOptions& opt) {
  LlamaModel model(opt.checkpoint);
  const auto& cfg = model.config();
  try {
    record_layers(opt.layers, cfg);  // a bad --layers fails before the model runs
  } catch (const Error& e) {
    throw Error(opt.checkpoint + ": " + e.what());
  }
  const Tokenizer tok = load_tokenizer(opt.checkpoint, opt.tokenizer, cfg.vocab_size);
  RecordResult res;
  const bool generate = opt.generate > 0;
  std::vector<int> input;
  int n = 0;
  if (generate) {
    if (opt.prompt.empty() && tok.bos_id() < 0) throw Error(opt.checkpoint + ": the model has no BOS token; give --prompt");
    input = opt.prompt.empty() ? std::vector<int>{tok.bos_id()} : tok.encode(opt.prompt, tok.add_bos(), false);
    if (input.empty()) throw Error("kvsim record: --prompt encodes to no tokens");
    n = opt.generate;
  } else if (!opt.token_ids.empty()) {
    input = opt.token_ids;
    n = int(input.size());
  } else {
    input = encode_text(opt, tok, 1).front();
    n = opt.tokens;
  }
  if (n > cfg.seq_len)
    throw Error(opt.checkpoint + ": " + std::to_string(n) + " positions requested but the model's seq_len is " +
                std::to_string(cfg.seq_len));
  if (opt.prefill != "auto" && opt.prefill != "batched" && opt.prefill != "per-token")
    throw Error("kvsim record: --prefill must be auto, batched or per-token, not '" + opt.prefill + "'");
  const bool batched = opt.prefill == "batched" || (opt.prefill == "auto" && cfg.gguf_version > 0);
  if (!generate && opt.policy.empty() && batched) return record_batched(opt, model, tok, input, n);
  // Buffers sized for n positions; generation may stop early at BOS.
  Trace tr(cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, n, cfg.head_dim());
  std::unique_ptr<PolicyKVAttention> attn;
  if (!opt.policy.empty()) {
    PolicySpec spec{opt.policy, opt.policy + "(" + opt.policy_params.to_string() + ")", opt.policy_params};
    attn = std::make_unique<PolicyKVAttention>(cfg, spec, n, opt.seed, opt.gqa);
    model.set_attention(attn.get());
  }
  res.path_taken = "per-token";
  const auto t0 = std::chrono::steady_clock::now();
  const int n_rec = run_positions(model, tok, input, n, generate, tr, res);
  res.forward_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!res.cross_entropy.empty()) res.mean_cross_entropy = mean_of(res.cross_entropy);
  if (attn) {  // the exact cache on the same tokens, for the closed-loop comparison
    model.set_attention(nullptr);
    if (generate) {
      std::vector<int> prompt(input.begin(), input.end());
      auto exact = greedy_tokens(model, prompt, n_rec, nullptr);
      for (int i = 0; i < n_rec && i < int(exact.size()); ++i)
        if (exact[i] != res.tokens[i]) {
          res.diverge_at = i;
          break;
        }
    } else {
      res.exact_cross_entropy = teacher_forced_ce(model, std::vector<int>(input.begin(), input.begin() + n_rec), nullptr);
    }
  }
  if (!opt.out.empty()) write_recording(opt, cfg, tr, n_rec, res);
  return res;
}

std::vector<int> text_tokens(const std::string& path, const Tokenizer& tok, int64_t want, double tail,
                             const std::string& need_name) {
  if (!(tail >= 0 && tail < 1)) throw Error("the text tail fraction must be in [0, 1), got " + std::to_string(tail));
  std::string text = read_text_file(path);
  if (text.empty()) throw Error(path + ": text file is empty");
  // Encoding is O(L log L); from the start, cap the text at a generous multiple of the tokens wanted
  // (a token covers at least one byte, and llama2.c vocabularies average 3-4 bytes per token).
  const size_t cap = size_t(std::max<int64_t>(want, 1)) * 16 + 64;
  if (tail == 0 && text.size() > cap) {
    size_t cut = text.find_first_of(" \n", cap);
    text.resize(cut == std::string::npos ? text.size() : cut);
  }
  std::vector<int> tokens;
  try {
    tokens = tok.encode_document(text);
  } catch (const Error& e) {
    throw Error(path + ": " + e.what());
  }
  if (tail > 0) {  // Python's data[-int(len(data) * tail):] of a training script's split
    const auto keep = static_cast<int64_t>(double(tokens.size()) * tail);
    tokens.erase(tokens.begin(), tokens.end() - keep);
  }
  if (int64_t(tokens.size()) < want)
    throw Error(path + ": text yields only " + std::to_string(tokens.size()) + " tokens" +
                (tail > 0 ? " in its last " + std::to_string(tail) + " share" : "") + ", fewer than " + need_name +
                " = " + std::to_string(want));
  return tokens;
}

std::vector<std::vector<int>> text_windows(const std::string& path, const Tokenizer& tok, int tokens, int windows,
                                           double tail, const std::string& need_name, std::vector<int64_t>* offsets) {
  if (tokens < 2 || windows < 1) throw Error("text windows need ≥ 2 tokens and ≥ 1 window");
  const bool bos_first = tok.bos_opens_sequence();
  // Text tokens each window takes from the stream; without a tail the stream opens with its own BOS.
  const int64_t per = bos_first ? tokens - 1 : tokens;
  const int64_t lead = bos_first && tail == 0 ? 1 : 0;
  std::vector<int> stream = text_tokens(path, tok, per * windows + lead, tail, need_name);
  if (bos_first && !stream.empty() && stream.front() == tok.bos_id()) stream.erase(stream.begin());
  if (int64_t(stream.size()) < per * windows)
    throw Error(path + ": text yields only " + std::to_string(stream.size()) + " tokens after BOS, fewer than " +
                need_name + " = " + std::to_string(per * windows) + " text tokens");
  std::vector<std::vector<int>> out;
  for (int w = 0; w < windows; ++w) {
    std::vector<int> win;
    win.reserve(size_t(tokens));
    if (bos_first) win.push_back(tok.bos_id());
    win.insert(win.end(), stream.begin() + w * per, stream.begin() + (w + 1) * per);
    out.push_back(std::move(win));
    if (offsets) offsets->push_back(w * per);
  }
  return out;
}

std::string window_path(const std::string& out, int w) {
  namespace fs = std::filesystem;
  const fs::path p(out);
  char suffix[16];
  std::snprintf(suffix, sizeof suffix, "_w%02d", w);
  return (p.parent_path() / (p.stem().string() + suffix + p.extension().string())).string();
}

std::vector<std::string> record_windows(const RecordOptions& opt, int windows) {
  if (windows < 1) throw Error("kvsim record: --windows must be ≥ 1");
  if (opt.generate > 0 || opt.text_path.empty()) throw Error("kvsim record: --windows needs --text (teacher-forced)");
  if (opt.out.empty()) throw Error("kvsim record: --windows needs --out (window w goes to OUT_wNN.h5)");
  LlamaModel probe(opt.checkpoint);
  const Tokenizer tok = load_tokenizer(opt.checkpoint, opt.tokenizer, probe.config().vocab_size);
  std::vector<int64_t> offsets;
  const std::vector<std::vector<int>> all = encode_text(opt, tok, windows, &offsets);
  std::vector<std::string> paths;
  for (int w = 0; w < windows; ++w) {
    RecordOptions one = opt;
    one.token_ids = all[size_t(w)];
    one.out = window_path(opt.out, w);
    one.text_token_offset = offsets[size_t(w)];
    record_model(one);
    paths.push_back(one.out);
  }
  return paths;
}

}  // namespace kvsim
