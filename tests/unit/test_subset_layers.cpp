// kvsim: a recording of some of a model's layers (`kvsim record --layers`, datasets/subset_recording.py):
// the reader's subset_layers / model_n_layers attributes, and the model's layer reaching the policies.
#include <catch2/catch.hpp>
#include <functional>

#include "../sim/replay/cell_policies.hpp"
#include "helpers.hpp"
#include "kvsim/cli/config.hpp"
#include "kvsim/core/error.hpp"
#include "kvsim/io/recording.hpp"
#include "kvsim/replay/engine.hpp"

using namespace kvsim;
using Catch::Matchers::Contains;

namespace {

/// A 3-layer recording (2 query heads, 1 KV head, 40 tokens, head_dim 4) with `attrs` set before finish().
void write_small(const std::string& path, const std::function<void(RecordingWriter&)>& attrs) {
  RecordingMeta m;
  m.model = "test";
  m.source = "unit test";
  m.n_layers = 3;
  m.n_heads = 2;
  m.n_kv_heads = 1;
  m.head_dim = 4;
  m.n_tokens = 40;
  m.softmax_scale = 0.5;
  RecordingWriter w(path, m);
  for (int l = 0; l < 3; ++l) {
    for (int h = 0; h < 2; ++h) w.write(l, Tensor::q, h, MatF::Constant(40, 4, float(l + h + 1)));
    w.write(l, Tensor::k, 0, MatF::Constant(40, 4, 0.5f));
    w.write(l, Tensor::v, 0, MatF::Constant(40, 4, 1.0f));
  }
  if (attrs) attrs(w);
  w.finish();
}

void require_error(const std::string& path, const std::string& needle) {
  CHECK_THROWS_WITH(RecordingReader(path), Contains(needle));
}

}  // namespace

TEST_CASE("schema: subset_layers and model_n_layers name a layer subset's place in the model", "[schema]") {
  test::TempDir tmp;
  auto with = [&](const std::string& name, const std::function<void(RecordingWriter&)>& attrs) {
    const std::string p = tmp.file(name);
    write_small(p, attrs);
    return p;
  };
  RecordingReader r(with("subset.h5", [](RecordingWriter& w) {
    w.set_attr("subset_layers", std::vector<int64_t>{5, 11, 17});
    w.set_attr("model_n_layers", int64_t(18));
  }));
  CHECK(r.meta().model_layer(2) == 17);
  CHECK(r.meta().model_layer_count() == 18);
  RecordingReader plain(with("plain.h5", {}));  // the negative control: a full file maps layers to themselves
  CHECK(plain.meta().model_layer(2) == 2);
  CHECK(plain.meta().model_layer_count() == 3);
  require_error(with("count.h5", [](RecordingWriter& w) { w.set_attr("subset_layers", std::vector<int64_t>{5, 11}); }),
                "attribute 'subset_layers' has 2 entries for 3 layers");
  require_error(with("neg.h5", [](RecordingWriter& w) { w.set_attr("subset_layers", std::vector<int64_t>{5, -1, 17}); }),
                "attribute 'subset_layers' holds layer -1");
  require_error(with("beyond.h5", [](RecordingWriter& w) {
                  w.set_attr("subset_layers", std::vector<int64_t>{5, 11, 18});
                  w.set_attr("model_n_layers", int64_t(18));
                }),
                "holds layer 18, outside the model's layers");
  require_error(with("few.h5", [](RecordingWriter& w) {
                  w.set_attr("subset_layers", std::vector<int64_t>{0, 1, 2});
                  w.set_attr("model_n_layers", int64_t(2));
                }),
                "'model_n_layers' = 2 is below n_layers");
  // The seeds follow the model's layer: a seeded policy on file layer 2 of the subset draws as on layer 17.
  const std::string cfg = "[data]\npath = \"" + r.path() + "\"\n[[policy]]\nname = \"uniform\"\nbudget = 0.25\n";
  const Experiment ex = parse_experiment(cfg, "inline");
  const Cell c2{2, 0, {0, 1}};
  CHECK(cell_stream(ex, c2, 40, r.meta()).layer == 17);
  CHECK(cell_stream(ex, c2, 40, plain.meta()).layer == 2);
  CHECK(cell::instance_seed(ex, c2, r.meta().model_layer(2), 0, 0) != cell::instance_seed(ex, c2, 2, 0, 0));
  // data.layers numbers the file's layers; naming a model layer says which ones the file holds.
  CHECK_THROWS_WITH(run_experiment(parse_experiment(cfg, "inline", {"data.layers=[17]"}), r, 1),
                    Contains("layer 17 is out of range [0, 3) (this recording holds the model's layers 5 as 0, 11 as 1, 17 as 2)"));
}
