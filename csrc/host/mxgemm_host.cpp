// mxgemm's HIP launcher: a CPython extension (no torch, no HIP headers: the HIP runtime is
// resolved with dlopen, so it builds on any machine with a C++ compiler and Python headers).
//
//   rt = Runtime("libamdhip64.so")               # dlopen + the module API
//   fn = rt.function(code_object_bytes, "name")  # hipModuleLoadData + hipModuleGetFunction
//   k = Kernel(rt, fn, "name", grid, block, dynamic_lds, kernarg_template, pointer_offsets)
//   k(stream, ptr0, ptr1, ...)                   # hipModuleLaunchKernel
//
// A Kernel is made once per plan: its kernarg template holds every constant field, and a call
// only writes the pointers at their offsets into a stack copy and launches, so a launch costs
// one vectorcall, one memcpy and the runtime's own launch.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dlfcn.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace {

typedef int (*load_t)(void**, const void*);
typedef int (*get_function_t)(void**, void*, const char*);
typedef int (*launch_t)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*, void**,
                        void**);
typedef const char* (*error_name_t)(int);

constexpr size_t kMaxKernarg = 4096;  // gfx9 kernarg segments are at most 4 KiB

struct Runtime {
  PyObject_HEAD
  void* lib;
  load_t load;
  get_function_t get_function;
  launch_t launch;
  error_name_t error_name;
  PyObject* path;
};

struct Kernel {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  Runtime* rt;
  void* fn;
  unsigned grid[3], block[3], dynamic_lds;
  std::vector<uint8_t>* kernarg;
  std::vector<uint32_t>* offsets;
  std::string* name;
};

PyObject* hip_error(Runtime* rt, const char* what, const std::string& kernel, int err) {
  const char* name = rt->error_name ? rt->error_name(err) : "";
  PyErr_Format(PyExc_RuntimeError, "%s(%s) failed: HIP error %d %s (runtime %U)", what, kernel.c_str(), err, name,
               rt->path);
  return nullptr;
}

// ---- Runtime
int runtime_init(Runtime* self, PyObject* args, PyObject*) {
  PyObject* path;
  if (!PyArg_ParseTuple(args, "U", &path)) return -1;
  const char* p = PyUnicode_AsUTF8(path);
  self->lib = dlopen(p, RTLD_NOW | RTLD_LOCAL);
  if (!self->lib) {
    PyErr_Format(PyExc_OSError, "cannot load the HIP runtime %s: %s", p, dlerror());
    return -1;
  }
  self->load = (load_t)dlsym(self->lib, "hipModuleLoadData");
  self->get_function = (get_function_t)dlsym(self->lib, "hipModuleGetFunction");
  self->launch = (launch_t)dlsym(self->lib, "hipModuleLaunchKernel");
  self->error_name = (error_name_t)dlsym(self->lib, "hipGetErrorName");
  if (!self->load || !self->get_function || !self->launch) {
    PyErr_Format(PyExc_OSError, "the HIP runtime %s lacks the module API (hipModuleLoadData, "
                 "hipModuleGetFunction, hipModuleLaunchKernel)", p);
    return -1;
  }
  Py_INCREF(path);
  self->path = path;
  return 0;
}

void runtime_dealloc(Runtime* self) {
  Py_XDECREF(self->path);  // the library stays loaded: its modules may outlive this object
  Py_TYPE(self)->tp_free((PyObject*)self);
}

// function(code_object: bytes, name: str) -> int: the kernel's hipFunction_t
PyObject* runtime_function(Runtime* self, PyObject* args) {
  Py_buffer code;
  const char* name;
  if (!PyArg_ParseTuple(args, "y*s", &code, &name)) return nullptr;
  void* module = nullptr;
  void* fn = nullptr;
  int err = self->load(&module, code.buf);
  PyBuffer_Release(&code);
  if (err) return hip_error(self, "hipModuleLoadData", name, err);
  if ((err = self->get_function(&fn, module, name))) return hip_error(self, "hipModuleGetFunction", name, err);
  return PyLong_FromVoidPtr(fn);
}

PyMethodDef runtime_methods[] = {
    {"function", (PyCFunction)runtime_function, METH_VARARGS, "load a code object, return a kernel's handle"},
    {nullptr}};

PyTypeObject RuntimeType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// ---- Kernel
PyObject* kernel_call(PyObject* obj, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  auto* self = (Kernel*)obj;
  Py_ssize_t n = PyVectorcall_NARGS(nargsf);
  const auto& offsets = *self->offsets;
  if (kwnames || n != (Py_ssize_t)offsets.size() + 1) {
    PyErr_Format(PyExc_TypeError, "kernel %s takes (stream, %zu pointers), got %zd arguments", self->name->c_str(),
                 offsets.size(), n);
    return nullptr;
  }
  void* stream = PyLong_AsVoidPtr(args[0]);
  uint8_t buf[kMaxKernarg];
  size_t size = self->kernarg->size();
  std::memcpy(buf, self->kernarg->data(), size);
  for (size_t i = 0; i < offsets.size(); ++i) {
    void* p = PyLong_AsVoidPtr(args[i + 1]);
    std::memcpy(buf + offsets[i], &p, sizeof p);
  }
  if (PyErr_Occurred()) return nullptr;
  // HIP_LAUNCH_PARAM_BUFFER_POINTER, buf, HIP_LAUNCH_PARAM_BUFFER_SIZE, &size, HIP_LAUNCH_PARAM_END
  void* config[] = {(void*)1, buf, (void*)2, &size, (void*)3};
  int err = self->rt->launch(self->fn, self->grid[0], self->grid[1], self->grid[2], self->block[0], self->block[1],
                             self->block[2], self->dynamic_lds, stream, nullptr, config);
  if (err) return PyErr_Occurred() ? nullptr : hip_error(self->rt, "hipModuleLaunchKernel", *self->name, err);
  Py_RETURN_NONE;
}

int kernel_init(Kernel* self, PyObject* args, PyObject*) {
  PyObject *rt, *offsets;
  Py_buffer kernarg;
  unsigned long long fn;
  const char* name;
  if (!PyArg_ParseTuple(args, "O!Ks(III)(III)Iy*O", &RuntimeType, &rt, &fn, &name, &self->grid[0], &self->grid[1],
                        &self->grid[2], &self->block[0], &self->block[1], &self->block[2], &self->dynamic_lds,
                        &kernarg, &offsets))
    return -1;
  self->kernarg = new std::vector<uint8_t>((uint8_t*)kernarg.buf, (uint8_t*)kernarg.buf + kernarg.len);
  PyBuffer_Release(&kernarg);
  self->offsets = new std::vector<uint32_t>();
  self->name = new std::string(name);
  if (self->kernarg->size() > kMaxKernarg) {
    PyErr_Format(PyExc_ValueError, "kernel %s: kernarg segment of %zu bytes exceeds %zu", name,
                 self->kernarg->size(), kMaxKernarg);
    return -1;
  }
  PyObject* seq = PySequence_Fast(offsets, "pointer offsets must be a sequence");
  if (!seq) return -1;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); ++i) {
    size_t off = PyLong_AsSize_t(PySequence_Fast_GET_ITEM(seq, i));
    if (off == (size_t)-1 || off + sizeof(void*) > self->kernarg->size()) {
      Py_DECREF(seq);
      if (!PyErr_Occurred())
        PyErr_Format(PyExc_ValueError, "kernel %s: pointer offset %zu outside its kernarg segment", name, off);
      return -1;
    }
    self->offsets->push_back((uint32_t)off);
  }
  Py_DECREF(seq);
  Py_INCREF(rt);
  self->rt = (Runtime*)rt;
  self->fn = (void*)(uintptr_t)fn;
  self->vectorcall = kernel_call;
  return 0;
}

void kernel_dealloc(Kernel* self) {
  Py_XDECREF((PyObject*)self->rt);
  delete self->kernarg;
  delete self->offsets;
  delete self->name;
  Py_TYPE(self)->tp_free((PyObject*)self);
}

PyTypeObject KernelType = {PyVarObject_HEAD_INIT(nullptr, 0)};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "mxgemm_host", "mxgemm HIP launcher", -1, nullptr};

}  // namespace

PyMODINIT_FUNC PyInit_mxgemm_host() {
  RuntimeType.tp_name = "mxgemm_host.Runtime";
  RuntimeType.tp_basicsize = sizeof(Runtime);
  RuntimeType.tp_flags = Py_TPFLAGS_DEFAULT;
  RuntimeType.tp_new = PyType_GenericNew;
  RuntimeType.tp_init = (initproc)runtime_init;
  RuntimeType.tp_dealloc = (destructor)runtime_dealloc;
  RuntimeType.tp_methods = runtime_methods;
  RuntimeType.tp_doc = "Runtime(path): a HIP runtime library and its module API";
  KernelType.tp_name = "mxgemm_host.Kernel";
  KernelType.tp_basicsize = sizeof(Kernel);
  KernelType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL;
  KernelType.tp_vectorcall_offset = offsetof(Kernel, vectorcall);
  KernelType.tp_call = PyVectorcall_Call;
  KernelType.tp_new = PyType_GenericNew;
  KernelType.tp_init = (initproc)kernel_init;
  KernelType.tp_dealloc = (destructor)kernel_dealloc;
  KernelType.tp_doc = "Kernel(runtime, function, name, grid, block, dynamic_lds, kernarg, pointer_offsets)";
  if (PyType_Ready(&RuntimeType) < 0 || PyType_Ready(&KernelType) < 0) return nullptr;
  PyObject* m = PyModule_Create(&module);
  if (!m) return nullptr;
  Py_INCREF(&RuntimeType);
  Py_INCREF(&KernelType);
  PyModule_AddObject(m, "Runtime", (PyObject*)&RuntimeType);
  PyModule_AddObject(m, "Kernel", (PyObject*)&KernelType);
  return m;
}
