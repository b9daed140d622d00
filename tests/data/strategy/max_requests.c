/*
 * A custom batching strategy for Triton's dynamic batcher: a batch holds at most MAX_REQUESTS requests,
 * whatever maxBatchSize and the preferred batch sizes would allow.
 *
 * Triton (core/src/backend_model.cc, SetBatchingStrategy) opens the library named by the model config
 * parameter TRITON_BATCH_STRATEGY_PATH and needs all five TRITONBACKEND_ModelBatch* functions. While it
 * forms a batch (core/src/dynamic_batch_scheduler.cc) it calls ModelBatchInitialize once per batch, then
 * ModelBatchIncludeRequest for each queued request in turn: a request the strategy refuses ends the batch
 * (it waits for the next one), and ModelBatchFinalize once the batch is sent or abandoned.
 *
 * Build: gcc -std=c11 -shared -fPIC -DMAX_REQUESTS=2 -o max_requests.so tests/data/strategy/max_requests.c
 * TRITONSERVER_ErrorNew is left undefined here: tritonserver's own libtritonserver.so provides it at load.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

/* The part of Triton's C API this strategy uses, declared here rather than included, because the tests have no
 * Triton headers to include: the nvidia-pytriton wheel they serve with ships tritonserver's binaries and
 * libraries but no tritonserver.h or tritonbackend.h, and the tests fetch nothing from outside package
 * registries. (Included, the headers would also need g++: tritonbackend.h, like tritonserver.h of Triton 2.51,
 * writes `TRITONSERVER_Error*` after only `struct TRITONSERVER_Error;`, valid C++ but not C; both wrap their
 * declarations in extern "C" for C++.) The types are opaque; the error codes count from 0 in the order of
 * TRITONSERVER_Error_Code in tritonserver.h (UNKNOWN, then INTERNAL); the five entry points are the ones
 * tritonbackend.h declares for a batching strategy, with the same signatures. */
typedef struct TRITONSERVER_Error TRITONSERVER_Error;
typedef struct TRITONBACKEND_Batcher TRITONBACKEND_Batcher;
typedef struct TRITONBACKEND_Model TRITONBACKEND_Model;
typedef struct TRITONBACKEND_Request TRITONBACKEND_Request;
typedef enum { TRITONSERVER_ERROR_UNKNOWN = 0, TRITONSERVER_ERROR_INTERNAL = 1 } TRITONSERVER_Error_Code;

TRITONSERVER_Error* TRITONSERVER_ErrorNew(TRITONSERVER_Error_Code code, const char* msg);

TRITONSERVER_Error* TRITONBACKEND_ModelBatcherInitialize(TRITONBACKEND_Batcher** batcher, TRITONBACKEND_Model* model);
TRITONSERVER_Error* TRITONBACKEND_ModelBatcherFinalize(TRITONBACKEND_Batcher* batcher);
TRITONSERVER_Error* TRITONBACKEND_ModelBatchInitialize(const TRITONBACKEND_Batcher* batcher, void** userp);
TRITONSERVER_Error* TRITONBACKEND_ModelBatchIncludeRequest(TRITONBACKEND_Request* request, void* userp,
                                                           bool* should_include);
TRITONSERVER_Error* TRITONBACKEND_ModelBatchFinalize(void* userp);

#ifndef MAX_REQUESTS
#error "define MAX_REQUESTS, the most requests one batch may hold (-DMAX_REQUESTS=2)"
#endif

/* What every batch of the model shares, read-only: the cap. */
struct limits {
  uint32_t max_requests;
};

/* One batch being formed: how many requests it took so far, and its cap. */
struct pending_batch {
  uint32_t requests;
  uint32_t max_requests;
};

TRITONSERVER_Error*
TRITONBACKEND_ModelBatcherInitialize(TRITONBACKEND_Batcher** batcher, TRITONBACKEND_Model* model)
{
  (void)model;
  struct limits* limits = malloc(sizeof *limits);
  if (limits == NULL) {
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, "max_requests strategy: out of memory");
  }
  limits->max_requests = MAX_REQUESTS;
  *batcher = (TRITONBACKEND_Batcher*)limits;
  return NULL;
}

TRITONSERVER_Error*
TRITONBACKEND_ModelBatcherFinalize(TRITONBACKEND_Batcher* batcher)
{
  free(batcher);
  return NULL;
}

TRITONSERVER_Error*
TRITONBACKEND_ModelBatchInitialize(const TRITONBACKEND_Batcher* batcher, void** userp)
{
  const struct limits* limits = (const struct limits*)batcher;
  struct pending_batch* batch = malloc(sizeof *batch);
  if (batch == NULL) {
    *userp = NULL;
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, "max_requests strategy: out of memory");
  }
  batch->requests = 0;
  batch->max_requests = limits->max_requests;
  *userp = batch;
  return NULL;
}

TRITONSERVER_Error*
TRITONBACKEND_ModelBatchIncludeRequest(TRITONBACKEND_Request* request, void* userp, bool* should_include)
{
  (void)request;
  struct pending_batch* batch = userp;
  if (batch == NULL) {
    /* Triton clears the record when it finalizes a batch, and may then offer that batch, while it waits for an
     * instance, more requests: it takes none (they start the next batch). */
    *should_include = false;
    return NULL;
  }
  *should_include = batch->requests < batch->max_requests;
  if (*should_include) {
    batch->requests++;
  }
  return NULL;
}

TRITONSERVER_Error*
TRITONBACKEND_ModelBatchFinalize(void* userp)
{
  free(userp);
  return NULL;
}
