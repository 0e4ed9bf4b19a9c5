/* python/fa4/_fastpath.c — the eager torch calls' host path in C: fa4_tensor descriptions of torch
 * tensors and the C ABI call, in one Python call.
 *
 * Why: an eager attention call from Python spent ~7 us describing its five tensors through ctypes
 * (attribute reads, a ctypes struct and a struct.pack_into per tensor) and ~1 us in the ctypes
 * call itself, against ~6 us in libfa4 (bench/host_overhead.py). Here each tensor costs its
 * attribute reads only (~0.5 us), and libfa4's entry point is called directly: 4-9 us less per
 * eager call on the H200 machine.
 *
 * No torch headers: tensors are read through their Python attributes (data_ptr(), shape,
 * stride(), dtype, is_cuda / is_cpu, get_device()), as python/fa4/_core.py describe_torch does, so
 * the module does not depend on torch's C++ ABI. No link to libfa4 either: the entry points'
 * addresses come from the loaded library (ctypes) with each call, so the module always calls the
 * library the package loaded. What this module cannot describe (a dtype, device or rank fa4 does
 * not take, a non-tensor) it leaves to the ctypes path, which raises the error that names the
 * tensor and the rule.
 *
 * Functions:
 *   init(dtype_codes, raw_stream)  dtype_codes: {torch.dtype: fa4_dtype code}; raw_stream: callable
 *                                  (device index) -> cudaStream_t as an int (torch's current
 *                                  stream), or None when torch has no CUDA.
 *   call(entry, tensors, trailing) entry: address of libfa4's fa4_forward (5 tensors, trailing:
 *                                  the fa4_options address), fa4_forward_with_kvcache (5; options,
 *                                  fa4_kvcache_args), fa4_backward (10, dsink None for NULL;
 *                                  options) or fa4_backward_workspace_size (10; options, the
 *                                  uint64_t it writes), called through its own prototype (which
 *                                  one: by the argument counts) with the fa4_tensor of each item of `tensors`
 *                                  and the addresses in `trailing`. Python's lock is released
 *                                  during the library call, as ctypes does. Returns the status
 *                                  (int), or None when a tensor cannot be described (nothing was
 *                                  called).
 *   call(entry, tensors, (options, args), kv)
 *                                  fa4_forward_with_kvcache with the fa4_kvcache_args at `args`
 *                                  copied and its five tensor pointers (k_new, v_new,
 *                                  cache_seqlens, cache_batch_idx, page_table) set to the
 *                                  descriptions of kv's five items (None: NULL); `args` itself is
 *                                  not written (one cached struct per num_splits serves every
 *                                  call).
 *   entries(forward, forward_with_kvcache, backward, backward_workspace_size)
 *                                  the loaded libfa4's entry addresses (None: absent). From then
 *                                  on call() raises ValueError for an entry that is not the
 *                                  function whose prototype its argument counts select.
 *   describe(tensor)               the fa4_tensor bytes call() would pass, or None (for tests).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#include "fa4/c_api.h"

#define FA4_FASTPATH_MAX_ARGS 10  /* tensors: fa4_backward takes 10 */
#define FA4_FASTPATH_STREAM_SLOTS 16 /* devices whose stream one call remembers */

static PyObject* g_dtype_codes = NULL; /* dict torch.dtype -> int */
static PyObject* g_raw_stream = NULL;  /* callable or None */
/* The loaded libfa4's entry points by prototype (kForward .. kWorkspaceSize), as entries() set them;
 * with g_have_entries, call() runs an entry only through the prototype of its own function. */
enum { kForward, kKVCache, kBackward, kWorkspaceSize, kNumProtos };
static const char* const kProtoNames[kNumProtos] = {"fa4_forward", "fa4_forward_with_kvcache",
                                                   "fa4_backward", "fa4_backward_workspace_size"};
static void* g_entries[kNumProtos];
static int g_have_entries = 0;
static PyObject *s_data_ptr, *s_shape, *s_stride, *s_dtype, *s_is_cuda, *s_is_cpu, *s_get_device;

/* One call's streams by device index (each looked up once per call, as describe_torch's dict). */
typedef struct {
  int index[FA4_FASTPATH_STREAM_SLOTS];
  void* stream[FA4_FASTPATH_STREAM_SLOTS];
  int n;
} StreamCache;

/* Result of describing one tensor. */
enum { kDescribed = 0, kFallBack = 1, kPyError = -1 };

static int int64_items(PyObject* tuple, int64_t* out, Py_ssize_t n) {
  for (Py_ssize_t i = 0; i < n; ++i) {
    const long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(tuple, i));
    if (v == -1 && PyErr_Occurred()) return kPyError;
    out[i] = (int64_t)v;
  }
  return kDescribed;
}

static int stream_of(int index, StreamCache* cache, void** stream) {
  for (int i = 0; i < cache->n; ++i)
    if (cache->index[i] == index) {
      *stream = cache->stream[i];
      return kDescribed;
    }
  PyObject* get = g_raw_stream;
  if (get == NULL || get == Py_None) return kFallBack;
  Py_INCREF(get); /* (an init() from another thread may replace it during the call) */
  PyObject* idx = PyLong_FromLong(index);
  if (idx == NULL) {
    Py_DECREF(get);
    return kPyError;
  }
  PyObject* r = PyObject_CallOneArg(get, idx);
  Py_DECREF(idx);
  Py_DECREF(get);
  if (r == NULL) return kPyError;
  void* s = PyLong_AsVoidPtr(r);
  Py_DECREF(r);
  if (s == NULL && PyErr_Occurred()) return kPyError;
  if (cache->n < FA4_FASTPATH_STREAM_SLOTS) {
    cache->index[cache->n] = index;
    cache->stream[cache->n] = s;
    ++cache->n;
  }
  *stream = s;
  return kDescribed;
}

static int describe_one(PyObject* x, PyObject* codes, fa4_tensor* t, StreamCache* cache) {
  memset(t, 0, sizeof(*t));
  int rc = kFallBack;
  PyObject *dtype = NULL, *shape = NULL, *stride = NULL, *flag = NULL, *index = NULL, *data = NULL;

  dtype = PyObject_GetAttr(x, s_dtype);
  if (dtype == NULL) goto not_a_tensor;
  PyObject* code = PyDict_GetItemWithError(codes, dtype); /* borrowed */
  if (code == NULL) {
    if (PyErr_Occurred()) { /* an unhashable "dtype": not a tensor */
      if (!PyErr_ExceptionMatches(PyExc_TypeError)) {
        rc = kPyError;
        goto done;
      }
      PyErr_Clear();
    }
    goto done;
  }
  const long code_value = PyLong_AsLong(code);
  if (code_value < 0 || code_value > INT32_MAX) { /* (init's table is ours: never, but no garbage) */
    PyErr_Clear();
    goto done;
  }
  t->dtype = (int32_t)code_value;

  shape = PyObject_GetAttr(x, s_shape);
  if (shape == NULL) goto not_a_tensor;
  if (!PyTuple_Check(shape) || PyTuple_GET_SIZE(shape) > FA4_MAX_DIMS) goto done;
  const Py_ssize_t n = PyTuple_GET_SIZE(shape);
  stride = PyObject_CallMethodNoArgs(x, s_stride);
  if (stride == NULL) goto not_a_tensor;
  if (!PyTuple_Check(stride) || PyTuple_GET_SIZE(stride) != n) goto done;
  t->ndim = (int32_t)n;
  if (int64_items(shape, t->shape, n) != kDescribed || int64_items(stride, t->stride, n) != kDescribed) {
    rc = kPyError;
    goto done;
  }

  flag = PyObject_GetAttr(x, s_is_cuda);
  if (flag == NULL) goto not_a_tensor;
  if (flag == Py_True) {
    index = PyObject_CallMethodNoArgs(x, s_get_device);
    if (index == NULL) goto not_a_tensor;
    const long i = PyLong_AsLong(index);
    if (i == -1 && PyErr_Occurred()) {
      rc = kPyError;
      goto done;
    }
    t->device_type = FA4_DEVICE_CUDA;
    t->device_index = (int32_t)i;
    const int s = stream_of((int)i, cache, &t->stream);
    if (s != kDescribed) {
      rc = s;
      goto done;
    }
  } else {
    Py_DECREF(flag);
    flag = PyObject_GetAttr(x, s_is_cpu);
    if (flag == NULL) goto not_a_tensor;
    if (flag != Py_True) goto done; /* another device: the ctypes path names it */
    t->device_type = FA4_DEVICE_CPU;
  }

  data = PyObject_CallMethodNoArgs(x, s_data_ptr);
  if (data == NULL) goto not_a_tensor;
  if (!PyLong_Check(data)) goto done;
  const unsigned long long address = PyLong_AsUnsignedLongLong(data);
  if (address == (unsigned long long)-1 && PyErr_Occurred()) {
    if (!PyErr_ExceptionMatches(PyExc_OverflowError)) {
      rc = kPyError;
      goto done;
    }
    PyErr_Clear(); /* a negative "address": the ctypes path refuses it */
    goto done;
  }
  t->data = (void*)(uintptr_t)address;
  rc = kDescribed;
  goto done;

not_a_tensor:
  /* An object without a tensor's attributes: the ctypes path raises the error that names it. */
  if (PyErr_ExceptionMatches(PyExc_AttributeError) || PyErr_ExceptionMatches(PyExc_TypeError)) {
    PyErr_Clear();
    rc = kFallBack;
  } else {
    rc = kPyError;
  }
done:
  Py_XDECREF(dtype);
  Py_XDECREF(shape);
  Py_XDECREF(stride);
  Py_XDECREF(flag);
  Py_XDECREF(index);
  Py_XDECREF(data);
  return rc;
}

static int require_init(void) {
  if (g_dtype_codes == NULL) {
    PyErr_SetString(PyExc_RuntimeError, "fa4._fastpath: init() has not been called");
    return -1;
  }
  return 0;
}

static PyObject* fp_init(PyObject* self, PyObject* args) {
  (void)self;
  PyObject *codes, *raw_stream;
  if (!PyArg_ParseTuple(args, "O!O:init", &PyDict_Type, &codes, &raw_stream)) return NULL;
  if (raw_stream != Py_None && !PyCallable_Check(raw_stream)) {
    PyErr_SetString(PyExc_TypeError, "fa4._fastpath.init: raw_stream must be callable or None");
    return NULL;
  }
  Py_INCREF(codes);
  Py_XSETREF(g_dtype_codes, codes);
  Py_INCREF(raw_stream);
  Py_XSETREF(g_raw_stream, raw_stream);
  Py_RETURN_NONE;
}

static PyObject* fp_entries(PyObject* self, PyObject* args) {
  (void)self;
  PyObject* o[kNumProtos];
  if (!PyArg_ParseTuple(args, "OOOO", &o[0], &o[1], &o[2], &o[3])) return NULL;
  void* e[kNumProtos];
  for (int i = 0; i < kNumProtos; ++i) {
    e[i] = o[i] == Py_None ? NULL : PyLong_AsVoidPtr(o[i]);
    if (e[i] == NULL && PyErr_Occurred()) return NULL;
  }
  memcpy(g_entries, e, sizeof(e));
  g_have_entries = 1;
  Py_RETURN_NONE;
}

/* The entry points' own prototypes (include/fa4/c_api.h). */
typedef int32_t (*ForwardFn)(const fa4_tensor*, const fa4_tensor*, const fa4_tensor*, const fa4_tensor*,
                             const fa4_tensor*, const fa4_options*);
typedef int32_t (*KVCacheFn)(const fa4_tensor*, const fa4_tensor*, const fa4_tensor*, const fa4_tensor*,
                             const fa4_tensor*, const fa4_options*, const fa4_kvcache_args*);
typedef int32_t (*BackwardFn)(const fa4_tensor*, const fa4_tensor*, const fa4_tensor*, const fa4_tensor*,
                              const fa4_tensor*, const fa4_tensor*, const fa4_tensor*, const fa4_tensor*,
                              const fa4_tensor*, const fa4_tensor*, const fa4_options*);
typedef int32_t (*WorkspaceSizeFn)(const fa4_tensor*, const fa4_tensor*, const fa4_tensor*, const fa4_tensor*,
                                   const fa4_tensor*, const fa4_tensor*, const fa4_tensor*, const fa4_tensor*,
                                   const fa4_tensor*, const fa4_tensor*, const fa4_options*, uint64_t*);

/* Describes the items of `tensors` (None: NULL) into t[i], their addresses into a[i]: kDescribed,
 * kFallBack or kPyError. */
static int describe_all(PyObject* tensors, PyObject* codes, fa4_tensor* t, const fa4_tensor** a,
                        StreamCache* cache) {
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(tensors); ++i) {
    PyObject* item = PyTuple_GET_ITEM(tensors, i);
    if (item == Py_None) {
      a[i] = NULL;
      continue;
    }
    const int rc = describe_one(item, codes, &t[i], cache);
    if (rc != kDescribed) return rc;
    a[i] = &t[i];
  }
  return kDescribed;
}

static PyObject* fp_call(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  (void)self;
  if ((nargs != 3 && nargs != 4) || !PyTuple_Check(args[1]) || !PyTuple_Check(args[2]) ||
      (nargs == 4 && !PyTuple_Check(args[3]))) {
    PyErr_SetString(PyExc_TypeError,
                    "fa4._fastpath.call(entry, tensors: tuple, trailing: tuple[, kv: tuple])");
    return NULL;
  }
  if (require_init() < 0) return NULL;
  void* entry = PyLong_AsVoidPtr(args[0]);
  if (entry == NULL) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "fa4._fastpath.call: entry is NULL");
    return NULL;
  }
  PyObject* tensors = args[1];
  PyObject* trailing = args[2];
  const Py_ssize_t nt = PyTuple_GET_SIZE(tensors), nx = PyTuple_GET_SIZE(trailing);
  PyObject* kv_tensors = nargs == 4 ? args[3] : NULL;
  if (!((nt == 5 && (nx == 1 || nx == 2)) || (nt == 10 && (nx == 1 || nx == 2))) ||
      (kv_tensors != NULL && !(nt == 5 && nx == 2 && PyTuple_GET_SIZE(kv_tensors) == 5))) {
    PyErr_SetString(PyExc_ValueError,
                    "fa4._fastpath.call: libfa4 has no entry point taking these arguments "
                    "(5 tensors + options [+ kvcache args [+ its 5 tensors]], or 10 tensors + "
                    "options [+ the workspace size's address])");
    return NULL;
  }
  /* The counts pick the prototype; calling another function through it would pass it the wrong
   * arguments, so an entry not registered for that prototype is refused. */
  const int proto = nt == 10 ? (nx == 2 ? kWorkspaceSize : kBackward) : (nx == 2 ? kKVCache : kForward);
  if (g_have_entries && entry != g_entries[proto]) {
    PyErr_Format(PyExc_ValueError,
                 g_entries[proto] == NULL
                     ? "fa4._fastpath.call: these arguments are %s's, and entries() registered none"
                     : "fa4._fastpath.call: these arguments are %s's, and entry is not the one "
                       "registered by entries()",
                 kProtoNames[proto]);
    return NULL;
  }
  fa4_tensor t[FA4_FASTPATH_MAX_ARGS], tk[5];
  const fa4_tensor* a[FA4_FASTPATH_MAX_ARGS];
  const fa4_tensor* ak[5];
  void* x[2] = {NULL, NULL}; /* the trailing addresses */
  for (Py_ssize_t i = 0; i < nx; ++i) {
    x[i] = PyLong_AsVoidPtr(PyTuple_GET_ITEM(trailing, i));
    if (x[i] == NULL && PyErr_Occurred()) return NULL;
  }
  fa4_kvcache_args kv;
  if (kv_tensors != NULL) {
    /* Another size (a module and a binding of different ABI versions): the ctypes path's call. */
    if (x[1] == NULL || ((const fa4_kvcache_args*)x[1])->struct_size != sizeof(fa4_kvcache_args))
      Py_RETURN_NONE;
    memcpy(&kv, x[1], sizeof(kv));
  }
  StreamCache cache;
  cache.n = 0;
  /* Own reference: reading a tensor's attributes may run Python code, and with it an init(). */
  PyObject* codes = g_dtype_codes;
  Py_INCREF(codes);
  /* The KV-cache call's own tensors first, in the ctypes path's order (an error reading one of
   * them comes before one reading q's). */
  int rc = kv_tensors != NULL ? describe_all(kv_tensors, codes, tk, ak, &cache) : kDescribed;
  if (rc == kDescribed) rc = describe_all(tensors, codes, t, a, &cache);
  Py_DECREF(codes);
  if (rc == kPyError) return NULL;
  if (rc == kFallBack) Py_RETURN_NONE;
  if (kv_tensors != NULL) {
    kv.k_new = ak[0];
    kv.v_new = ak[1];
    kv.cache_seqlens = ak[2];
    kv.cache_batch_idx = ak[3];
    kv.page_table = ak[4];
    x[1] = &kv;
  }
  int32_t status;
  /* The tensors stay alive through the caller's tuple, the descriptions are on this stack and
   * libfa4 calls no Python: its work runs without Python's lock, as a ctypes call's does. */
  Py_BEGIN_ALLOW_THREADS
  if (nt == 10 && nx == 2)
    status = ((WorkspaceSizeFn)entry)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9],
                                      (const fa4_options*)x[0], (uint64_t*)x[1]);
  else if (nt == 10)
    status = ((BackwardFn)entry)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9],
                                 (const fa4_options*)x[0]);
  else if (nx == 2)
    status = ((KVCacheFn)entry)(a[0], a[1], a[2], a[3], a[4], (const fa4_options*)x[0],
                                (const fa4_kvcache_args*)x[1]);
  else
    status = ((ForwardFn)entry)(a[0], a[1], a[2], a[3], a[4], (const fa4_options*)x[0]);
  Py_END_ALLOW_THREADS
  return PyLong_FromLong(status);
}

static PyObject* fp_describe(PyObject* self, PyObject* x) {
  (void)self;
  if (require_init() < 0) return NULL;
  fa4_tensor t;
  StreamCache cache;
  cache.n = 0;
  PyObject* codes = g_dtype_codes;
  Py_INCREF(codes);
  const int rc = describe_one(x, codes, &t, &cache);
  Py_DECREF(codes);
  if (rc == kPyError) return NULL;
  if (rc == kFallBack) Py_RETURN_NONE;
  return PyBytes_FromStringAndSize((const char*)&t, sizeof(t));
}

static PyMethodDef fp_methods[] = {
    {"init", fp_init, METH_VARARGS, "init(dtype_codes: dict, raw_stream: callable | None) -> None"},
    {"call", (PyCFunction)(void (*)(void))fp_call, METH_FASTCALL,
     "call(entry: int, tensors: tuple, trailing: tuple[, kv: tuple]) -> int | None"},
    {"describe", fp_describe, METH_O, "describe(tensor) -> bytes | None"},
    {"entries", fp_entries, METH_VARARGS,
     "entries(forward, forward_with_kvcache, backward, backward_workspace_size) -> None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef fp_module = {PyModuleDef_HEAD_INIT, "_fastpath",
                                       "fa4's eager torch host path in C (python/fa4/_fastpath.c)", -1,
                                       fp_methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__fastpath(void) {
  s_data_ptr = PyUnicode_InternFromString("data_ptr");
  s_shape = PyUnicode_InternFromString("shape");
  s_stride = PyUnicode_InternFromString("stride");
  s_dtype = PyUnicode_InternFromString("dtype");
  s_is_cuda = PyUnicode_InternFromString("is_cuda");
  s_is_cpu = PyUnicode_InternFromString("is_cpu");
  s_get_device = PyUnicode_InternFromString("get_device");
  if (!s_data_ptr || !s_shape || !s_stride || !s_dtype || !s_is_cuda || !s_is_cpu || !s_get_device) return NULL;
  PyObject* m = PyModule_Create(&fp_module);
  /* The argument shapes call() takes beyond ABI 3's: 10 tensors + 2 (the workspace size query).
   * A binding checks it before passing them, since a module built beside an older libfa4 may be
   * the one loaded. */
  if (m != NULL && PyModule_AddIntConstant(m, "CALLS_WORKSPACE_SIZE", 1) < 0) {
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
