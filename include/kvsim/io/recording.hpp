// kvsim: the recording schema (docs/recordings.md, the schema) — reader, writer, and the StreamSource interface that the
// replay engine reads one (layer, head) at a time from (a recording file or a synthetic preset).
//
// Schema (kvsim_schema = 1), one HDF5 file per recorded sequence:
//   root attributes: kvsim_schema (int 1), model (str), source (str), n_layers, n_heads, n_kv_heads,
//                    head_dim, n_tokens (int), softmax_scale (double), rope (str: "applied"|"none")
//   /tokens              int32 [n]                          (optional for synthetic streams)
//   /layer_{l:03d}/q     float32|float16 [n_heads,    n, head_dim]
//   /layer_{l:03d}/k     float32|float16 [n_kv_heads, n, head_dim]   (post-rotary when rope="applied")
//   /layer_{l:03d}/v     float32|float16 [n_kv_heads, n, head_dim]
// Optional: /layer_{l:03d}/attn float32 [n_heads, n, head_dim] — the attention output the recorder
// computed inside the model (used to check replay fidelity); /cross_entropy float32 [n-1] — per-token
// cross-entropy (nats) of predicting tokens[i+1] at position i (teacher-forced recordings).
// Optional root attributes: rope_theta, rope_pairs, layer_windows, subset_layers + model_n_layers
// (RecordingMeta below). Grouped-query attention: query head h uses kv head h / (n_heads / n_kv_heads).
#pragma once
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kvsim/io/h5.hpp"
#include "kvsim/core/types.hpp"

namespace kvsim {

struct RecordingMeta {
  int schema = 1;
  std::string model;
  std::string source;
  std::string rope = "none";
  int n_layers = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int64_t n_tokens = 0;
  double softmax_scale = 0.0;  ///< multiplies q·k; 1/sqrt(head_dim) when the file does not say
  /// Optional RoPE attributes (docs/recordings.md): rope_theta, the base θ (0 = not recorded), and
  /// rope_pairs, "halves …" (channels k, k + head_dim/2: rope_halves) or "adjacent …" (2k, 2k + 1).
  double rope_theta = 0.0;
  bool rope_halves = true;
  /// Optional attribute layer_windows: per layer, the tokens its attention sees (a local,
  /// sliding-window layer: its last w tokens, itself included) or 0 (global: all earlier tokens).
  /// Empty when the file does not say: every layer global. Gemma 3: 512 on five of six layers.
  std::vector<int64_t> layer_windows;
  int64_t layer_window(int l) const { return l < int(layer_windows.size()) ? layer_windows[size_t(l)] : 0; }
  /// Optional attribute subset_layers: a recording of some of a model's layers (`kvsim record --layers`,
  /// datasets/subset_recording.py) stores them renumbered 0, 1, …; entry l is layer l's index in the model.
  /// Empty: the file's layers are the model's.
  std::vector<int64_t> subset_layers;
  int64_t model_layer(int l) const { return l < int(subset_layers.size()) ? subset_layers[size_t(l)] : l; }
  /// Optional attribute model_n_layers: the model's layer count when the file holds a subset (else 0).
  int model_n_layers = 0;
  /// The model's layer count: model_n_layers, or the file's own n_layers.
  int model_layer_count() const { return model_n_layers > 0 ? model_n_layers : n_layers; }
  /// Whether layer l is local for this recording: a window shorter than the recording (a window
  /// that covers every token acts as global attention).
  bool is_local(int l) const { return layer_window(l) > 0 && layer_window(l) < n_tokens; }
  int group_size() const { return n_heads / n_kv_heads; }
  int kv_head_of(int q_head) const { return q_head / group_size(); }
};

/// Which tensor of a layer: query, key, value, or the recorder's own attention output.
enum class Tensor { q, k, v, attn };
const char* tensor_name(Tensor t);

/// Where the engine reads streams from. Implementations must be safe to call from several threads
/// at once (each call reads or generates one head independently).
class StreamSource {
 public:
  virtual ~StreamSource() = default;
  virtual const RecordingMeta& meta() const = 0;
  /// One head of one layer as an [n, head_dim] matrix. `head` is a query head for Tensor::q/attn and
  /// a kv head for k/v. Throws kvsim::Error (naming file, dataset, index) on bad or non-finite data.
  virtual MatF read(int layer, Tensor which, int head) const = 0;
  /// A short description for logs and result attributes.
  virtual std::string describe() const = 0;
};

/// Reads a recording file. The constructor validates all attributes and every dataset's shape;
/// values are checked for NaN/Inf when a head is read. Reads are serialized (HDF5 is not
/// thread-safe in Debian's build) but each reads only one hyperslab, never the whole file.
class RecordingReader final : public StreamSource {
 public:
  explicit RecordingReader(const std::string& path);
  const RecordingMeta& meta() const override { return meta_; }
  MatF read(int layer, Tensor which, int head) const override;
  std::string describe() const override { return "recording " + path_; }
  bool has(int layer, Tensor which) const;
  std::vector<int32_t> tokens() const;           ///< empty if the file has no /tokens
  std::vector<double> cross_entropy() const;     ///< empty if the file has no /cross_entropy
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::unique_ptr<h5::File> file_;
  RecordingMeta meta_;
};

std::string layer_dataset(int layer, Tensor which);

/// Writes a recording atomically: everything goes to `path + ".tmp"`, and `finish()` renames it into
/// place. Destroying an unfinished writer removes the temporary file.
class RecordingWriter {
 public:
  /// `deflate`: 0 (the default) writes the tensors uncompressed; 1-9 applies shuffle + deflate at
  /// that level. Deflate saves only ~15% on float32 q/k/v (SmolLM2: 236 -> 202 MB per 2048 tokens)
  /// and cost ~27% of `kvsim record`'s time (docs/performance.md); readers take either.
  RecordingWriter(const std::string& path, const RecordingMeta& meta, bool with_attn = false, int deflate = 0);
  ~RecordingWriter();
  RecordingWriter(const RecordingWriter&) = delete;
  RecordingWriter& operator=(const RecordingWriter&) = delete;
  /// `m` is [n_tokens, head_dim].
  void write(int layer, Tensor which, int head, const MatF& m);
  void write_tokens(const std::vector<int32_t>& tokens);
  void write_cross_entropy(const std::vector<float>& ce);
  void set_attr(const std::string& name, double v);
  void set_attr(const std::string& name, int64_t v);
  void set_attr(const std::string& name, const std::string& v);
  void set_attr(const std::string& name, const std::vector<int64_t>& v);
  void finish();

 private:
  std::string path_, tmp_;
  std::unique_ptr<h5::File> file_;
  RecordingMeta meta_;
  bool done_ = false;
};

/// Serializes all HDF5 calls in the process (Debian's libhdf5 is built without thread safety).
std::mutex& hdf5_mutex();

}  // namespace kvsim
