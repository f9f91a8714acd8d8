// mxgemm HIP launcher: hipModuleLoadData + hipModuleLaunchKernel of a code object with a
// kernarg segment packed by mxgemm.launcher (Python) from the kernel's own metadata. Built only
// with a ROCm torch; the HIP runtime is resolved with dlopen, so no HIP headers are needed.
#include <torch/extension.h>

#include <dlfcn.h>

#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

// Minimal HIP module API, resolved at run time from libamdhip64.
typedef int (*hipModuleLoadData_t)(void**, const void*);
typedef int (*hipModuleGetFunction_t)(void**, void*, const char*);
typedef int (*hipModuleLaunchKernel_t)(void*, unsigned, unsigned, unsigned, unsigned, unsigned,
                                       unsigned, unsigned, void*, void**, void**);

class HipLauncher {
 public:
  HipLauncher() {
    lib_ = dlopen("libamdhip64.so", RTLD_NOW | RTLD_GLOBAL);
    TORCH_CHECK(lib_, "hip backend: cannot load libamdhip64.so (is ROCm installed?)");
    load_ = (hipModuleLoadData_t)dlsym(lib_, "hipModuleLoadData");
    getf_ = (hipModuleGetFunction_t)dlsym(lib_, "hipModuleGetFunction");
    launch_ = (hipModuleLaunchKernel_t)dlsym(lib_, "hipModuleLaunchKernel");
    TORCH_CHECK(load_ && getf_ && launch_, "hip backend: HIP module API not found");
  }

  // code: code object bytes; stream: hipStream_t of torch's current stream (from Python)
  void launch(const std::string& code, const std::string& kernel, const std::vector<int64_t>& grid,
              const std::vector<int64_t>& block, const std::string& kernarg, int64_t dynamic_lds,
              uint64_t stream) {
    TORCH_CHECK(grid.size() == 3 && block.size() == 3, "grid and block must have 3 dimensions");
    void* fn = function(code, kernel);
    std::string args = kernarg;
    size_t size = args.size();
    // HIP_LAUNCH_PARAM_BUFFER_POINTER / _SIZE / _END
    void* config[] = {(void*)0x01, args.data(), (void*)0x02, &size, (void*)0x03};
    int err = launch_(fn, grid[0], grid[1], grid[2], block[0], block[1], block[2], (unsigned)dynamic_lds,
                      reinterpret_cast<void*>(stream), nullptr, config);
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

void launch(const py::bytes& code, const std::string& kernel, const std::vector<int64_t>& grid,
            const std::vector<int64_t>& block, const py::bytes& kernarg, int64_t dynamic_lds, uint64_t stream) {
  static HipLauncher* launcher = new HipLauncher();  // never destroyed: outlives the interpreter
  launcher->launch(code, kernel, grid, block, kernarg, dynamic_lds, stream);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "mxgemm HIP launcher";
  m.def("launch", &launch, "launch a kernel of a code object with a packed kernarg segment");
}
