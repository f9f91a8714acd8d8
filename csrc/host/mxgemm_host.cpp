// mxgemm host launch path: tensor checks, kernarg packing from the kernel's own metadata, and
// a Launcher with two backends:
//   hip: hipModuleLoadData + hipModuleLaunchKernel on a real GPU (compiled only with a ROCm
//        torch, MXGEMM_WITH_HIP; the HIP runtime is resolved with dlopen so no HIP headers
//        are needed at build time);
//   emu: hands the packed kernarg to the Python emulator (mxgemm.emu) through a callback.
#include <torch/extension.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#ifdef MXGEMM_WITH_HIP
#include <dlfcn.h>
#endif

namespace py = pybind11;

namespace {

// One kernel argument as the code object's metadata describes it (.amdgpu_metadata .args).
struct ArgSlot {
  int64_t offset;
  int64_t size;
  std::string kind;  // global_buffer, by_value, hidden_block_count_x, ...
};

struct Launch {
  std::vector<int64_t> grid, block;  // workgroups, threads per workgroup
  int64_t dynamic_lds;
  uint64_t stream = 0;  // hipStream_t of torch's current stream (from Python), 0 for emu
};

void put(std::vector<uint8_t>& buf, int64_t off, const void* src, int64_t n) {
  TORCH_CHECK(off >= 0 && off + n <= (int64_t)buf.size(), "kernarg slot [", off, ", ", off + n,
              ") exceeds the kernarg segment of ", buf.size(), " bytes");
  std::memcpy(buf.data() + off, src, n);
}

// Little-endian: the low s.size bytes of v (integers are range-checked by the caller).
template <typename T>
void put_value(std::vector<uint8_t>& buf, const ArgSlot& s, T v) {
  std::vector<uint8_t> tmp(s.size, 0);
  std::memcpy(tmp.data(), &v, std::min<size_t>(sizeof(T), s.size));
  put(buf, s.offset, tmp.data(), s.size);
}

// Hidden arguments, filled as the ROCm runtime does for code object v5+.
void put_hidden(std::vector<uint8_t>& buf, const ArgSlot& s, const Launch& L) {
  auto dim = [&](char c) { return c == 'x' ? 0 : c == 'y' ? 1 : 2; };
  const std::string& k = s.kind;
  int64_t v = 0;
  if (k.rfind("hidden_block_count_", 0) == 0) {
    v = L.grid[dim(k.back())];
  } else if (k.rfind("hidden_group_size_", 0) == 0) {
    v = L.block[dim(k.back())];
  } else if (k.rfind("hidden_remainder_", 0) == 0) {
    v = 0;  // grid is a whole number of workgroups by construction
  } else if (k == "hidden_grid_dims") {
    v = L.grid[2] > 1 ? 3 : L.grid[1] > 1 ? 2 : 1;
  } else if (k == "hidden_dynamic_lds_size") {
    v = L.dynamic_lds;
  }  // other hidden args (queue, printf, heap, ...) are unused by our kernels: zero
  put_value<int64_t>(buf, s, v);
}

// Packs user arguments (tensors, ints, floats) into the kernarg segment.
py::bytes pack_kernarg(const std::vector<std::tuple<int64_t, int64_t, std::string>>& layout,
                       int64_t kernarg_size, const py::list& args, const std::vector<int64_t>& grid,
                       const std::vector<int64_t>& block, int64_t dynamic_lds) {
  std::vector<uint8_t> buf(kernarg_size, 0);
  Launch L{grid, block, dynamic_lds, 0};
  size_t user = 0;
  for (const auto& [off, size, kind] : layout) {
    ArgSlot s{off, size, kind};
    if (kind.rfind("hidden_", 0) == 0) {
      put_hidden(buf, s, L);
      continue;
    }
    TORCH_CHECK(user < args.size(), "kernel expects more arguments than the ", args.size(), " given");
    py::handle a = args[user++];
    if (kind == "global_buffer") {
      uint64_t ptr = 0;
      if (THPVariable_Check(a.ptr())) {
        ptr = reinterpret_cast<uint64_t>(THPVariable_Unpack(a.ptr()).data_ptr());
      } else if (py::hasattr(a, "address")) {  // emulator sparse buffer
        ptr = a.attr("address").cast<uint64_t>();
      } else {
        TORCH_CHECK(false, "argument ", user - 1, " must be a tensor (pointer slot), got ",
                    std::string(py::str(py::type::handle_of(a))));
      }
      put_value<uint64_t>(buf, s, ptr);
    } else if (kind == "by_value") {
      if (py::isinstance<py::bool_>(a) || py::isinstance<py::int_>(a)) {
        int64_t v = a.cast<int64_t>();
        if (size == 4)
          TORCH_CHECK(v >= INT32_MIN && v <= (int64_t)UINT32_MAX, "argument ", user - 1, " = ", v,
                      " does not fit its 4-byte slot");
        put_value<int64_t>(buf, s, v);
      } else if (py::isinstance<py::float_>(a)) {
        if (size == 4)
          put_value<float>(buf, s, a.cast<float>());
        else
          put_value<double>(buf, s, a.cast<double>());
      } else {
        TORCH_CHECK(false, "argument ", user - 1, " must be int or float (by-value slot)");
      }
    } else {
      TORCH_CHECK(false, "unsupported kernel argument kind ", kind);
    }
  }
  TORCH_CHECK(user == args.size(), "kernel takes ", user, " arguments, ", args.size(), " given");
  return py::bytes(reinterpret_cast<const char*>(buf.data()), buf.size());
}

// ---- Launcher ------------------------------------------------------------------------------

class Launcher {
 public:
  virtual ~Launcher() = default;
  virtual std::string name() const = 0;
  // code: code object bytes (hip) or a handle understood by the backend (emu)
  virtual void launch(const py::object& code, const std::string& kernel, const Launch& L,
                      const py::bytes& kernarg, const py::list& buffers) = 0;
};

// Tensors handed to a backend must live where it executes.
void check_devices(const py::list& buffers, bool want_cpu, const std::string& backend) {
  for (auto b : buffers) {
    if (!THPVariable_Check(b.ptr())) continue;
    const auto& t = THPVariable_Unpack(b.ptr());
    TORCH_CHECK(t.device().is_cpu() == want_cpu, "backend ", backend, " needs ",
                want_cpu ? "CPU" : "GPU", " tensors, got one on ", t.device().str());
  }
}

class EmuLauncher : public Launcher {
 public:
  explicit EmuLauncher(py::object cb) : cb_(std::move(cb)) {}
  std::string name() const override { return "emu"; }
  void launch(const py::object& code, const std::string& kernel, const Launch& L,
              const py::bytes& kernarg, const py::list& buffers) override {
    check_devices(buffers, true, "emu");
    cb_(code, kernel, py::make_tuple(L.grid[0], L.grid[1], L.grid[2]),
        py::make_tuple(L.block[0], L.block[1], L.block[2]), kernarg, buffers, L.dynamic_lds);
  }

 private:
  py::object cb_;
};

#ifdef MXGEMM_WITH_HIP
// Minimal HIP module API, resolved at run time from libamdhip64.
typedef int (*hipModuleLoadData_t)(void**, const void*);
typedef int (*hipModuleGetFunction_t)(void**, void*, const char*);
typedef int (*hipModuleLaunchKernel_t)(void*, unsigned, unsigned, unsigned, unsigned, unsigned,
                                       unsigned, unsigned, void*, void**, void**);

class HipLauncher : public Launcher {
 public:
  HipLauncher() {
    lib_ = dlopen("libamdhip64.so", RTLD_NOW | RTLD_GLOBAL);
    TORCH_CHECK(lib_, "hip backend: cannot load libamdhip64.so (is ROCm installed?)");
    load_ = (hipModuleLoadData_t)dlsym(lib_, "hipModuleLoadData");
    getf_ = (hipModuleGetFunction_t)dlsym(lib_, "hipModuleGetFunction");
    launch_ = (hipModuleLaunchKernel_t)dlsym(lib_, "hipModuleLaunchKernel");
    TORCH_CHECK(load_ && getf_ && launch_, "hip backend: HIP module API not found");
  }
  std::string name() const override { return "hip"; }
  void launch(const py::object& code, const std::string& kernel, const Launch& L,
              const py::bytes& kernarg, const py::list& buffers) override {
    check_devices(buffers, false, "hip");
    std::string blob = code.cast<std::string>();
    void* fn = function(blob, kernel);
    std::string args = kernarg;
    size_t size = args.size();
    // HIP_LAUNCH_PARAM_BUFFER_POINTER / _SIZE / _END
    void* config[] = {(void*)0x01, args.data(), (void*)0x02, &size, (void*)0x03};
    void* stream = reinterpret_cast<void*>(L.stream);
    int err = launch_(fn, L.grid[0], L.grid[1], L.grid[2], L.block[0], L.block[1], L.block[2],
                      (unsigned)L.dynamic_lds, stream, nullptr, config);
    TORCH_CHECK(err == 0, "hipModuleLaunchKernel(", kernel, ") failed with error ", err);
  }

 private:
  void* function(const std::string& blob, const std::string& kernel) {
    std::lock_guard<std::mutex> g(mu_);
    auto key = std::to_string(std::hash<std::string>{}(blob)) + ":" + kernel;
    auto it = fns_.find(key);
    if (it != fns_.end()) return it->second;
    void* mod = nullptr;
    void* fn = nullptr;
    TORCH_CHECK(load_(&mod, blob.data()) == 0, "hipModuleLoadData failed for ", kernel);
    TORCH_CHECK(getf_(&fn, mod, kernel.c_str()) == 0, "hipModuleGetFunction(", kernel, ") failed");
    fns_[key] = fn;
    return fn;
  }
  void* lib_;
  hipModuleLoadData_t load_;
  hipModuleGetFunction_t getf_;
  hipModuleLaunchKernel_t launch_;
  std::mutex mu_;
  std::unordered_map<std::string, void*> fns_;
};
#endif

// Never destroyed: the emu launcher holds a Python callable, which must not be released by a
// static destructor after the interpreter has finalised.
std::unordered_map<std::string, std::shared_ptr<Launcher>>& launchers() {
  static auto* m = new std::unordered_map<std::string, std::shared_ptr<Launcher>>();
  return *m;
}

void set_emu_callback(py::object cb) { launchers()["emu"] = std::make_shared<EmuLauncher>(cb); }

bool has_hip() {
#ifdef MXGEMM_WITH_HIP
  return true;
#else
  return false;
#endif
}

void launch(const std::string& backend, const py::object& code, const std::string& kernel,
            const std::vector<int64_t>& grid, const std::vector<int64_t>& block,
            const py::bytes& kernarg, const py::list& buffers, int64_t dynamic_lds, uint64_t stream) {
  TORCH_CHECK(grid.size() == 3 && block.size() == 3, "grid and block must have 3 dimensions");
  auto& m = launchers();
#ifdef MXGEMM_WITH_HIP
  if (backend == "hip" && !m.count("hip")) m["hip"] = std::make_shared<HipLauncher>();
#endif
  auto it = m.find(backend);
  TORCH_CHECK(it != m.end(), "launch backend '", backend, "' is not available in this build",
              backend == "hip" ? " (compiled without ROCm)" : " (emulator callback not set)");
  it->second->launch(code, kernel, Launch{grid, block, dynamic_lds, stream}, kernarg, buffers);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "mxgemm host launch path (kernarg packing + Launcher backends)";
  m.def("pack_kernarg", &pack_kernarg, "pack arguments into a kernarg segment per metadata layout");
  m.def("launch", &launch, "launch a kernel through a backend ('hip' or 'emu')");
  m.def("set_emu_callback", &set_emu_callback, "install the Python emulator as the 'emu' backend");
  m.def("has_hip", &has_hip, "whether the hip backend was compiled in");
}
