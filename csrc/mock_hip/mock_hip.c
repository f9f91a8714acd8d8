// A stand-in for libamdhip64: the HIP module API that mxgemm's launcher resolves, with every
// module load, function lookup and launch handed to callbacks (mxgemm.mock_hip runs launches on
// the emulator). Without callbacks, loads and lookups succeed and launches do nothing: the
// host-overhead benchmark's no-op GPU. Built with the host C compiler; no HIP headers.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum {
  hipSuccess = 0, hipErrorInvalidValue = 1, hipErrorInvalidImage = 200,
  hipErrorInvalidResourceHandle = 400, hipErrorNotFound = 500, hipErrorLaunchFailure = 719,
};

typedef int (*load_cb)(uint64_t module, const void* image, uint64_t size);
typedef int (*function_cb)(uint64_t module, const char* name);
typedef int (*launch_cb)(uint64_t module, const char* name, const uint32_t* grid, const uint32_t* block,
                         uint32_t dynamic_lds, uint64_t stream, const void* kernarg, uint64_t kernarg_size);

static load_cb on_load;
static function_cb on_function;
static launch_cb on_launch;
static uint64_t next_module = 1;

struct function { uint64_t module; char name[256]; };

void mock_hip_set_callbacks(load_cb load, function_cb function, launch_cb launch) {
  on_load = load;
  on_function = function;
  on_launch = launch;
}

// Bytes of an ELF64 image: its section header table ends it (code objects put it last).
static uint64_t elf_size(const unsigned char* p) {
  if (memcmp(p, "\177ELF", 4) != 0 || p[4] != 2) return 0;
  uint64_t shoff; uint16_t shentsize, shnum;
  memcpy(&shoff, p + 0x28, 8);
  memcpy(&shentsize, p + 0x3a, 2);
  memcpy(&shnum, p + 0x3c, 2);
  return shoff + (uint64_t)shentsize * shnum;
}

int hipModuleLoadData(void** module, const void* image) {
  if (!module || !image) return hipErrorInvalidValue;
  uint64_t size = elf_size((const unsigned char*)image);
  if (!size) return hipErrorInvalidImage;
  uint64_t id = next_module++;
  int err = on_load ? on_load(id, image, size) : hipSuccess;
  if (err) return err;
  *module = (void*)(uintptr_t)id;
  return hipSuccess;
}

int hipModuleUnload(void* module) { return module ? hipSuccess : hipErrorInvalidResourceHandle; }

int hipModuleGetFunction(void** function, void* module, const char* name) {
  if (!function || !module || !name || strlen(name) >= sizeof(((struct function*)0)->name))
    return hipErrorInvalidValue;
  int err = on_function ? on_function((uint64_t)(uintptr_t)module, name) : hipSuccess;
  if (err) return err;
  struct function* f = calloc(1, sizeof *f);
  f->module = (uint64_t)(uintptr_t)module;
  strcpy(f->name, name);
  *function = f;
  return hipSuccess;
}

// extra: HIP_LAUNCH_PARAM_BUFFER_POINTER (1), ptr, HIP_LAUNCH_PARAM_BUFFER_SIZE (2), &size,
// HIP_LAUNCH_PARAM_END (3): the only argument form mxgemm uses.
int hipModuleLaunchKernel(void* function, uint32_t gx, uint32_t gy, uint32_t gz, uint32_t bx, uint32_t by,
                          uint32_t bz, uint32_t dynamic_lds, void* stream, void** params, void** extra) {
  struct function* f = function;
  if (!f) return hipErrorInvalidResourceHandle;
  if (params || !extra) return hipErrorInvalidValue;
  const void* kernarg = NULL;
  const size_t* size = NULL;
  for (int i = 0; extra[i] != (void*)3; i += 2) {
    if (i > 8) return hipErrorInvalidValue;
    if (extra[i] == (void*)1) kernarg = extra[i + 1];
    else if (extra[i] == (void*)2) size = extra[i + 1];
    else return hipErrorInvalidValue;
  }
  if (!kernarg || !size || !gx || !gy || !gz || !bx || !by || !bz) return hipErrorInvalidValue;
  uint32_t grid[3] = {gx, gy, gz}, block[3] = {bx, by, bz};
  return on_launch ? on_launch(f->module, f->name, grid, block, dynamic_lds, (uint64_t)(uintptr_t)stream,
                               kernarg, *size)
                   : hipSuccess;
}

const char* hipGetErrorName(int err) {
  switch (err) {
    case hipSuccess: return "hipSuccess";
    case hipErrorInvalidValue: return "hipErrorInvalidValue";
    case hipErrorInvalidImage: return "hipErrorInvalidImage";
    case hipErrorInvalidResourceHandle: return "hipErrorInvalidResourceHandle";
    case hipErrorNotFound: return "hipErrorNotFound";
    case hipErrorLaunchFailure: return "hipErrorLaunchFailure";
    default: return "hipErrorUnknown";
  }
}
