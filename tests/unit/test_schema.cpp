// Recording schema (docs/recordings.md, the schema): round trip and every rejection the reader must make.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>

#include "helpers.hpp"
#include "kvsim/core/error.hpp"
#include "kvsim/cli/config.hpp"
#include "kvsim/io/h5.hpp"
#include "kvsim/replay/engine.hpp"

using namespace kvsim;
using Catch::Matchers::Contains;

namespace {

/// Write a minimal valid recording by hand with the raw wrapper, then let `mutate` break it.
void write_raw(const std::string& path, int layers, int heads, int kv_heads, int n, int d,
               const std::function<void(h5::File&)>& mutate = {}, hid_t qtype = H5T_IEEE_F32LE) {
  auto f = h5::File::create(path);
  f.set_attr("/", "kvsim_schema", int64_t(1));
  f.set_attr("/", "model", std::string("test"));
  f.set_attr("/", "source", std::string("unit test"));
  f.set_attr("/", "n_layers", int64_t(layers));
  f.set_attr("/", "n_heads", int64_t(heads));
  f.set_attr("/", "n_kv_heads", int64_t(kv_heads));
  f.set_attr("/", "head_dim", int64_t(d));
  f.set_attr("/", "n_tokens", int64_t(n));
  f.set_attr("/", "softmax_scale", 0.5);
  f.set_attr("/", "rope", std::string("none"));
  std::vector<float> buf;
  for (int l = 0; l < layers; ++l) {
    for (auto [name, h] : {std::pair{"q", heads}, std::pair{"k", kv_heads}, std::pair{"v", kv_heads}}) {
      std::string ds = "/layer_" + std::string(l < 10 ? "00" : "0") + std::to_string(l) + "/" + name;
      if (n > 0) {
        f.create_dataset(ds, name == std::string("q") ? qtype : H5T_IEEE_F32LE, {hsize_t(h), hsize_t(n), hsize_t(d)},
                         {1, hsize_t(n), hsize_t(d)});
        buf.assign(size_t(h) * n * d, 0.f);
        for (size_t i = 0; i < buf.size(); ++i) buf[i] = float(std::sin(double(i) + l));
        f.write_slab(ds, H5T_NATIVE_FLOAT, {0, 0, 0}, {hsize_t(h), hsize_t(n), hsize_t(d)}, buf.data());
      }
    }
  }
  if (mutate) mutate(f);
}

void require_error(const std::string& path, const std::string& needle) {
  try {
    RecordingReader r(path);
    // Some errors only show when data is read.
    for (int l = 0; l < r.meta().n_layers; ++l) {
      for (int h = 0; h < r.meta().n_heads; ++h) r.read(l, Tensor::q, h);
      for (int h = 0; h < r.meta().n_kv_heads; ++h) {
        r.read(l, Tensor::k, h);
        r.read(l, Tensor::v, h);
      }
    }
  } catch (const Error& e) {
    INFO(e.what());
    CHECK_THAT(e.what(), Contains(path));
    CHECK_THAT(e.what(), Contains(needle));
    return;
  }
  FAIL("no error for " << needle);
}

}  // namespace

TEST_CASE("schema: synthetic recording round-trips exactly", "[schema]") {
  test::TempDir tmp;
  for (const std::string preset : {"gaussian", "clustered", "heavy_hitter"}) {
    SynthSource src(test::small_synth(preset));
    std::string path = tmp.file(preset + ".h5");
    write_synthetic(src, path);
    RecordingReader rec(path);
    const auto& m = rec.meta();
    CHECK(m.n_layers == 2);
    CHECK(m.n_heads == 4);
    CHECK(m.n_kv_heads == 2);
    CHECK(m.head_dim == 8);
    CHECK(m.n_tokens == 64);
    CHECK(m.softmax_scale == Approx(1 / std::sqrt(8.0)).epsilon(1e-15));
    for (int l = 0; l < 2; ++l) {
      for (int h = 0; h < 4; ++h) CHECK(rec.read(l, Tensor::q, h) == src.read(l, Tensor::q, h));
      for (int h = 0; h < 2; ++h) {
        CHECK(rec.read(l, Tensor::k, h) == src.read(l, Tensor::k, h));
        CHECK(rec.read(l, Tensor::v, h) == src.read(l, Tensor::v, h));
      }
    }
    CHECK_FALSE(std::filesystem::exists(path + ".tmp"));
  }
}

TEST_CASE("schema: synthetic streams are seeded and heads differ", "[schema]") {
  SynthSource a(test::small_synth("clustered")), b(test::small_synth("clustered"));
  CHECK(a.read(1, Tensor::k, 1) == b.read(1, Tensor::k, 1));
  CHECK(a.read(1, Tensor::k, 0) != a.read(1, Tensor::k, 1));
  auto p = test::small_synth("clustered");
  p.seed = 8;
  SynthSource c(p);
  CHECK(a.read(0, Tensor::q, 0) != c.read(0, Tensor::q, 0));
}

TEST_CASE("schema: clustered preset is (m delta)-clusterable as stored", "[schema]") {
  auto p = test::small_synth("clustered", 400, 16, 1, 2, 1);
  p.cluster_c = 2;
  p.cluster_gamma = 0.5;
  p.cluster_diameter = 0.3;
  SynthSource src(p);
  MatF K = src.read(0, Tensor::k, 0);
  auto lab = src.cluster_labels(0, 0);
  int64_t m = p.clusters_after(p.n);
  CHECK(m == int64_t(std::ceil(2 * std::sqrt(400.0))));
  for (int64_t i = 0; i < p.n; ++i) {
    REQUIRE(lab[i] < m);
    for (int64_t j = 0; j < i; ++j)
      if (lab[i] == lab[j]) REQUIRE((K.row(i) - K.row(j)).norm() <= p.cluster_diameter);
  }
  // Queries respect the norm bound r on the scaled query.
  MatF Q = src.read(0, Tensor::q, 0);
  double scale = src.meta().softmax_scale;
  CHECK(Q.rowwise().norm().maxCoeff() * scale <= p.query_norm * (1 + 1e-6));
}

TEST_CASE("schema: float16 queries are read and converted", "[schema]") {
  test::TempDir tmp;
  std::string path = tmp.file("f16.h5");
  h5::Handle f16(H5Tcopy(H5T_IEEE_F32LE));
  H5Tset_fields(f16.get(), 15, 10, 5, 0, 10);
  H5Tset_size(f16.get(), 2);
  H5Tset_ebias(f16.get(), 15);
  write_raw(path, 1, 2, 1, 16, 4, {}, f16.get());
  RecordingReader rec(path);
  MatF q = rec.read(0, Tensor::q, 1);
  // sin values rounded to half precision: |error| ≤ 2^-11 relative.
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 4; ++j) {
      double want = std::sin(double(16 * 4 + i * 4 + j));
      CHECK(std::abs(q(i, j) - want) <= std::abs(want) * std::ldexp(1.0, -11) + 1e-7);
    }
}

TEST_CASE("schema: malformed recordings are rejected naming file and dataset and index", "[schema]") {
  test::TempDir tmp;
  int k = 0;
  auto path = [&] { return tmp.file("bad" + std::to_string(k++) + ".h5"); };
  {
    auto p = path();
    write_raw(p, 1, 2, 1, 8, 4, [](h5::File& f) { H5Adelete(f.id(), "head_dim"); });
    require_error(p, "missing attribute 'head_dim'");
  }
  {
    auto p = path();
    write_raw(p, 2, 2, 1, 8, 4, [](h5::File& f) { H5Ldelete(f.id(), "/layer_001/v", H5P_DEFAULT); });
    require_error(p, "missing dataset '/layer_001/v'");
  }
  {
    auto p = path();
    write_raw(p, 1, 2, 1, 8, 4, [](h5::File& f) {
      H5Ldelete(f.id(), "/layer_000/k", H5P_DEFAULT);
      f.create_dataset("/layer_000/k", H5T_IEEE_F32LE, {8, 4}, {});
    });
    require_error(p, "'/layer_000/k' must have rank 3");
  }
  {
    auto p = path();
    write_raw(p, 1, 2, 1, 8, 4, [](h5::File& f) {
      H5Ldelete(f.id(), "/layer_000/q", H5P_DEFAULT);
      f.create_dataset("/layer_000/q", H5T_IEEE_F32LE, {2, 7, 4}, {});
    });
    require_error(p, "'/layer_000/q' has shape [2, 7, 4], expected [2, 8, 4]");
  }
  {
    auto p = path();
    write_raw(p, 1, 3, 2, 8, 4);
    require_error(p, "n_heads (3) is not a multiple of n_kv_heads (2)");
  }
  {
    auto p = path();
    write_raw(p, 1, 2, 1, 8, 4, [](h5::File& f) { f.set_attr("/", "n_kv_heads", int64_t(2)); });
    require_error(p, "'/layer_000/k' has shape [1, 8, 4], expected [2, 8, 4]");
  }
  {
    auto p = path();
    write_raw(p, 1, 2, 1, 8, 4, [](h5::File& f) {
      float bad = NAN;
      f.write_slab("/layer_000/v", H5T_NATIVE_FLOAT, {0, 5, 3}, {1, 1, 1}, &bad);
    });
    require_error(p, "'/layer_000/v' has a non-finite value (nan) at index [0, 5, 3]");
  }
  {
    auto p = path();
    write_raw(p, 1, 2, 1, 8, 4, [](h5::File& f) {
      float bad = INFINITY;
      f.write_slab("/layer_000/q", H5T_NATIVE_FLOAT, {1, 2, 0}, {1, 1, 1}, &bad);
    });
    require_error(p, "'/layer_000/q' has a non-finite value (inf) at index [1, 2, 0]");
  }
  {
    auto p = path();
    write_raw(p, 1, 2, 1, 0, 4);
    require_error(p, "'n_tokens' must be positive");
  }
  {
    auto p = path();
    write_raw(p, 1, 2, 1, 8, 4, [](h5::File& f) { f.set_attr("/", "kvsim_schema", int64_t(2)); });
    require_error(p, "unsupported kvsim_schema 2");
  }
  {
    auto p = path();
    write_raw(p, 1, 2, 1, 8, 4, [](h5::File& f) { f.set_attr("/", "n_layers", std::string("five")); });
    require_error(p, "attribute 'n_layers' must be an integer");
  }
  {
    auto p = tmp.file("not_hdf5.h5");
    std::ofstream(p) << "hello";
    require_error(p, "not an HDF5 file");
  }
  require_error(tmp.file("missing.h5"), "not an HDF5 file");
}

namespace {

/// Replace dataset `ds` of a valid recording by one of the same shape made with `dcpl` and `type`,
/// writing `write_heads` of its heads (chunked: chunk = one head) from float data.
void replace_dataset(h5::File& f, const std::string& ds, hid_t type, hid_t dcpl, int write_heads,
                     std::vector<hsize_t> shape = {1, 8, 4}, bool extendible = false) {
  H5Ldelete(f.id(), ds.c_str(), H5P_DEFAULT);
  std::vector<hsize_t> maxdims(shape.size(), H5S_UNLIMITED);
  h5::Handle sp(H5Screate_simple(int(shape.size()), shape.data(), extendible ? maxdims.data() : nullptr));
  h5::Handle d(H5Dcreate2(f.id(), ds.c_str(), type, sp.get(), H5P_DEFAULT, dcpl, H5P_DEFAULT));
  REQUIRE(d.valid());
  const hsize_t per_head = shape[1] * shape[2];
  std::vector<double> buf(per_head, 0.5);
  for (int h = 0; h < write_heads; ++h) {
    h5::Handle fs(H5Dget_space(d.get()));
    hsize_t off[3] = {hsize_t(h), 0, 0}, cnt[3] = {1, shape[1], shape[2]};
    H5Sselect_hyperslab(fs.get(), H5S_SELECT_SET, off, nullptr, cnt, nullptr);
    h5::Handle ms(H5Screate_simple(3, cnt, nullptr));
    REQUIRE(H5Dwrite(d.get(), H5T_NATIVE_DOUBLE, ms.get(), fs.get(), H5P_DEFAULT, buf.data()) >= 0);
  }
}

h5::Handle chunked_dcpl(std::vector<hsize_t> chunk) {
  h5::Handle p(H5Pcreate(H5P_DATASET_CREATE));
  H5Pset_chunk(p.get(), int(chunk.size()), chunk.data());
  return p;
}

}  // namespace

TEST_CASE("schema: element types and storage are checked before any read", "[schema][untrusted]") {
  test::TempDir tmp;
  int k = 0;
  auto path = [&] { return tmp.file("st" + std::to_string(k++) + ".h5"); };
  auto with = [&](const std::function<void(h5::File&)>& m) {
    auto p = path();
    write_raw(p, 1, 2, 1, 8, 4, m);
    return p;
  };
  // Negative control: a float64 copy of a valid dataset differs only in its type.
  auto p0 = with([](h5::File& f) { replace_dataset(f, "/layer_000/v", H5T_IEEE_F32LE, H5P_DEFAULT, 1); });
  CHECK_NOTHROW(RecordingReader(p0).read(0, Tensor::v, 0));
  require_error(with([](h5::File& f) { replace_dataset(f, "/layer_000/v", H5T_IEEE_F64LE, H5P_DEFAULT, 1); }),
                "dataset '/layer_000/v' has element type float64; the schema allows IEEE float32 or float16 only");
  require_error(with([](h5::File& f) { replace_dataset(f, "/layer_000/k", H5T_STD_I32LE, H5P_DEFAULT, 1); }),
                "dataset '/layer_000/k' has element type int32");
  // A contiguous dataset never written reads as zeros: refused, not replayed.
  require_error(with([](h5::File& f) { replace_dataset(f, "/layer_000/v", H5T_IEEE_F32LE, H5P_DEFAULT, 0); }),
                "dataset '/layer_000/v': storage holds 0 bytes");
  // A chunked dataset with one of two chunks written (the other would read as fill values).
  require_error(with([](h5::File& f) {
                  replace_dataset(f, "/layer_000/q", H5T_IEEE_F32LE, chunked_dcpl({1, 8, 4}).get(), 1, {2, 8, 4});
                }),
                "dataset '/layer_000/q': 1 of its 2 chunks hold data");
  CHECK_NOTHROW(RecordingReader(with([](h5::File& f) {
    replace_dataset(f, "/layer_000/q", H5T_IEEE_F32LE, chunked_dcpl({1, 8, 4}).get(), 2, {2, 8, 4});
  })));
  // Chunk dims larger than the dataset (possible for an extendible one), a filter kvsim does not read, external raw data.
  require_error(with([](h5::File& f) {
                  replace_dataset(f, "/layer_000/k", H5T_IEEE_F32LE, chunked_dcpl({1, 64, 4}).get(), 1, {1, 8, 4}, true);
                }),
                "dataset '/layer_000/k': chunk dims [1, 64, 4] do not fit its shape [1, 8, 4]");
  require_error(with([](h5::File& f) {
                  auto dcpl = chunked_dcpl({1, 8, 4});
                  H5Pset_nbit(dcpl.get());
                  replace_dataset(f, "/layer_000/k", H5T_IEEE_F32LE, dcpl.get(), 1);
                }),
                "dataset '/layer_000/k' uses the nbit filter");
  const std::string ext = tmp.file("raw.bin");
  require_error(with([&](h5::File& f) {
                  h5::Handle dcpl(H5Pcreate(H5P_DATASET_CREATE));
                  H5Pset_external(dcpl.get(), ext.c_str(), 0, 8 * 4 * 4);
                  replace_dataset(f, "/layer_000/v", H5T_IEEE_F32LE, dcpl.get(), 1);
                }),
                "dataset '/layer_000/v' keeps its data in external files");
  // Tokens must be int32; a float or int64 tokens dataset is refused by name.
  require_error(with([](h5::File& f) { f.write_vector("/tokens", std::vector<double>(8, 1.0)); }),
                "dataset '/tokens' has element type float64; the schema allows int32 only");
  require_error(with([](h5::File& f) { f.write_vector("/tokens", std::vector<int64_t>(8, 1)); }),
                "dataset '/tokens' has element type int64");
  CHECK_NOTHROW(RecordingReader(with([](h5::File& f) { f.write_vector("/tokens", std::vector<int32_t>(8, 1)); })));
  // The optional RoPE attributes: read when well formed, refused by name otherwise.
  const RecordingReader rope(with([](h5::File& f) {
    f.set_attr("/", "rope_theta", 500000.0);
    f.set_attr("/", "rope_pairs", std::string("adjacent (2k, 2k + 1)"));
  }));
  CHECK(rope.meta().rope_theta == 500000.0);
  CHECK_FALSE(rope.meta().rope_halves);
  require_error(with([](h5::File& f) { f.set_attr("/", "rope_theta", 0.5); }), "attribute 'rope_theta' must be a finite number > 1");
  require_error(with([](h5::File& f) { f.set_attr("/", "rope_pairs", std::string("diagonal")); }),
                "attribute 'rope_pairs' = 'diagonal' is neither");
}

TEST_CASE("schema: an unfinished writer leaves no file behind", "[schema]") {
  test::TempDir tmp;
  std::string path = tmp.file("partial.h5");
  {
    RecordingMeta m;
    m.n_layers = 1;
    m.n_heads = m.n_kv_heads = 1;
    m.head_dim = 4;
    m.n_tokens = 8;
    RecordingWriter w(path, m);
    w.write(0, Tensor::q, 0, MatF::Ones(8, 4));
    // no finish(): simulates a crash or an exception mid-write
  }
  CHECK_FALSE(std::filesystem::exists(path));
  CHECK_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST_CASE("schema: layer_windows names local layers and the replay takes the global ones", "[schema]") {
  test::TempDir tmp;
  auto with = [&](const std::string& name, const std::function<void(h5::File&)>& mutate) {
    const std::string p = tmp.file(name);
    write_raw(p, 3, 2, 1, 40, 4, mutate);
    return p;
  };
  const std::string local = with("local.h5", [](h5::File& f) { f.set_attr("/", "layer_windows", std::vector<int64_t>{16, 0, 16}); });
  RecordingReader r(local);
  CHECK(r.meta().layer_windows == std::vector<int64_t>{16, 0, 16});
  CHECK(r.meta().layer_window(0) == 16);
  CHECK(r.meta().layer_window(1) == 0);
  // Without the attribute every layer is global (the negative control of the default).
  RecordingReader plain(with("plain.h5", {}));
  CHECK(plain.meta().layer_windows.empty());
  CHECK(plain.meta().layer_window(0) == 0);
  require_error(with("count.h5", [](h5::File& f) { f.set_attr("/", "layer_windows", std::vector<int64_t>{16, 0}); }),
                "attribute 'layer_windows' has 2 entries for 3 layers");
  require_error(with("neg.h5", [](h5::File& f) { f.set_attr("/", "layer_windows", std::vector<int64_t>{16, -1, 16}); }),
                "negative window");
  // The replay: global layers only by default; a local layer named in data.layers is refused.
  const std::string cfg = "[data]\npath = \"" + local + "\"\n[[policy]]\nname = \"window\"\nbudget = 0.5\n";
  const RunResult res = run_experiment(parse_experiment(cfg, "inline"), r, 1);
  CHECK(res.layers == std::vector<int>{1});
  for (const auto& row : res.policies.at(0).rows) CHECK(row.layer == 1);
  CHECK(run_experiment(parse_experiment(cfg, "inline"), plain, 1).layers == std::vector<int>{0, 1, 2});
  // A window that covers the whole recording (64 ≥ 40 tokens) acts as global attention.
  RecordingReader wide(with("wide.h5", [](h5::File& f) { f.set_attr("/", "layer_windows", std::vector<int64_t>{64, 0, 64}); }));
  CHECK_FALSE(wide.meta().is_local(0));
  CHECK(run_experiment(parse_experiment(cfg, "inline"), wide, 1).layers == std::vector<int>{0, 1, 2});
  CHECK_THROWS_WITH(run_experiment(parse_experiment(cfg, "inline", {"data.layers=[0, 1]"}), r, 1),
                    Contains("data.layers: layer 0 is a local layer (sliding window of 16 tokens)"));
  // data.local_layers = "replay": every layer is replayed, a local one against window attention. The
  // window policy keeping the last 16 tokens then answers as the reference does on layer 0 (its own
  // window), while the full cache (policy exact) is off there once t > 16: the negative control,
  // which on the global layer 1 is the one that matches.
  const std::string rcfg = "[data]\npath = \"" + local + "\"\nlocal_layers = \"replay\"\n[[policy]]\nname = \"window\"\n"
                           "budget = 16\n[[policy]]\nname = \"exact\"\n";
  const RunResult rr = run_experiment(parse_experiment(rcfg, "inline"), r, 1);
  CHECK(rr.layers == std::vector<int>{0, 1, 2});
  double win_local = 0, full_local = 0, full_local_late = 1e9, full_global = 0, win_global_late = 1e9;
  for (const auto& row : rr.policies.at(0).rows)
    if (row.layer == 0) win_local = std::max(win_local, metric_of(row, "rel_err"));
    else if (row.layer == 1 && row.step > 24) win_global_late = std::min(win_global_late, metric_of(row, "rel_err"));
  for (const auto& row : rr.policies.at(1).rows)
    if (row.layer == 1) full_global = std::max(full_global, metric_of(row, "rel_err"));
    else if (row.layer == 0) {
      full_local = std::max(full_local, row.step <= 16 ? metric_of(row, "rel_err") : 0.0);
      if (row.step > 24) full_local_late = std::min(full_local_late, metric_of(row, "rel_err"));
    }
  CHECK(win_local < 1e-9);
  CHECK(full_global < 1e-9);
  CHECK(full_local < 1e-9);  // up to t = 16 the window holds every key
  CHECK(full_local_late > 1e-4);
  CHECK(win_global_late > 1e-4);
  CHECK_THROWS_WITH(parse_experiment(rcfg + "", "inline", {"data.local_layers=\"all\""}),
                    Contains("data.local_layers must be \"exact\""));
}

TEST_CASE("schema: on a hybrid recording PyramidKV's pyramid runs over the global layers it compresses", "[schema][prefill]") {
  // Four layers, the second and fourth global (Gemma 3's pattern in small). With the local layers left
  // exact, the paper's budgets fall from layer 1 to 3 and average exactly M there, as other policies hold.
  test::TempDir tmp;
  const std::string p = tmp.file("hybrid.h5");
  write_raw(p, 4, 2, 1, 40, 4, [](h5::File& f) { f.set_attr("/", "layer_windows", std::vector<int64_t>{16, 0, 16, 0}); });
  const RecordingReader r(p);
  auto last_tokens = [&](const std::string& extra) {  // cache_tokens per layer at the last step, M = 16
    const std::string cfg = "[data]\npath = \"" + p + "\"\nprefill = 32\n" + extra + "[[policy]]\nname = \"pyramidkv\"\nmemory = 16\n";
    std::vector<double> out(4, -1.0);
    for (const auto& row : run_experiment(parse_experiment(cfg, "inline"), r, 1).policies.at(0).rows)
      if (row.step == 40) out[size_t(row.layer)] = metric_of(row, "cache_tokens");
    return out;
  };
  const auto global = last_tokens("");
  CHECK((global[0] == -1.0 && global[2] == -1.0));  // local layers: not replayed
  CHECK((global[1] > 16 && global[3] < 16));
  CHECK(global[1] + global[3] == Approx(32.0));
  // Control: replaying the local layers too spreads the pyramid over all four layers; layers 1 and 3
  // then hold a four-layer pyramid's budgets, whose sum is not 2M.
  const auto all = last_tokens("local_layers = \"replay\"\n");
  CHECK(all[0] + all[1] + all[2] + all[3] == Approx(64.0));
  CHECK(all[1] + all[3] != Approx(32.0));
  CHECK(all[1] < global[1]);
}

TEST_CASE("schema: recordings are written uncompressed by default, deflated on request, and read alike", "[schema]") {
  test::TempDir tmp;
  RecordingMeta m;
  m.n_layers = 1;
  m.n_heads = 2;
  m.n_kv_heads = 1;
  m.head_dim = 8;
  m.n_tokens = 1500;  // two chunks of 1024 rows, the second partly filled
  MatF x(1500, 8);
  for (int64_t i = 0; i < x.size(); ++i) x.data()[i] = float(std::sin(0.37 * double(i)));
  auto write = [&](const std::string& name, int deflate) {
    const std::string p = tmp.file(name);
    RecordingWriter w(p, m, false, deflate);
    for (Tensor t : {Tensor::q, Tensor::k, Tensor::v})
      for (int h = 0; h < (t == Tensor::q ? 2 : 1); ++h) w.write(0, t, h, x * float(h + 1));
    w.finish();
    return p;
  };
  const std::string raw = write("raw.h5", 0), packed = write("packed.h5", 4);
  const auto info = [](const std::string& p) { return h5::File::open_read(p).dataset_info(layer_dataset(0, Tensor::k)); };
  CHECK(info(raw).filters.empty());
  CHECK(info(packed).filters.size() == 2);  // shuffle + deflate: the option really compresses
  const RecordingReader a(raw), b(packed);
  for (Tensor t : {Tensor::q, Tensor::k, Tensor::v}) CHECK(a.read(0, t, 0) == b.read(0, t, 0));
  CHECK(a.read(0, Tensor::q, 1) == x * 2.0f);
  CHECK(std::filesystem::file_size(packed) < std::filesystem::file_size(raw));
  CHECK_THROWS_WITH(RecordingWriter(tmp.file("bad.h5"), m, false, 10), Catch::Matchers::Contains("deflate level 10 is not 0-9"));
}
