/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The few CUDA driver API types and values the fake driver and the
 * interposer need, written from the driver's documented ABI (no CUDA
 * headers are needed to build either).  Only what is used is declared.
 */
#ifndef GPUSHARE_CUDA_ABI_H
#define GPUSHARE_CUDA_ABI_H

#include <stddef.h>
#include <stdint.h>

typedef int CUresult;
typedef int CUdevice;			/* equal to the device's ordinal */
typedef unsigned long long CUdeviceptr;	/* 64-bit builds only */
typedef unsigned long long CUmemGenericAllocationHandle;
typedef uint64_t cuuint64_t;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef struct CUarray_st *CUarray;
typedef struct CUmipmappedArray_st *CUmipmappedArray;
typedef struct { unsigned char bytes[16]; } CUuuid;
typedef struct CUfunc_st *CUfunction;
typedef struct CUevent_st *CUevent;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphNode_st *CUgraphNode;
typedef struct CUgraphExec_st *CUgraphExec;
typedef void (*CUhostFn)(void *userData);

enum {
	CUDA_SUCCESS = 0,
	CUDA_ERROR_INVALID_VALUE = 1,
	CUDA_ERROR_OUT_OF_MEMORY = 2,
	CUDA_ERROR_NOT_INITIALIZED = 3,
	CUDA_ERROR_INVALID_DEVICE = 101,
	CUDA_ERROR_INVALID_CONTEXT = 201,
	CUDA_ERROR_INVALID_HANDLE = 400,
	CUDA_ERROR_NOT_FOUND = 500,
	CUDA_ERROR_NOT_READY = 600,
	CUDA_ERROR_NOT_PERMITTED = 800,
	CUDA_ERROR_NOT_SUPPORTED = 801,
};

/* cuGetProcAddress flags */
#define CU_GET_PROC_ADDRESS_DEFAULT			0
#define CU_GET_PROC_ADDRESS_LEGACY_STREAM		1
#define CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM	2

/* cuGetProcAddress_v2's symbolStatus */
typedef enum {
	CU_GET_PROC_ADDRESS_SUCCESS = 0,
	CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1,
	CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2,
} CUdriverProcAddressQueryResult;

/* Stream handles with a fixed meaning. */
#define CU_STREAM_LEGACY	((CUstream)0x1)
#define CU_STREAM_PER_THREAD	((CUstream)0x2)

enum { CU_MEM_LOCATION_TYPE_INVALID = 0, CU_MEM_LOCATION_TYPE_DEVICE = 1 };

typedef struct {
	int type;		/* CU_MEM_LOCATION_TYPE_* */
	int id;			/* the device ordinal for TYPE_DEVICE */
} CUmemLocation;

/* CUmemAllocationProp (cuMemCreate): only the head is read. */
typedef struct {
	int type;
	int requestedHandleTypes;
	CUmemLocation location;
	void *win32HandleMetaData;
	struct {
		unsigned char compressionType;
		unsigned char gpuDirectRDMACapable;
		unsigned short usage;
		unsigned char reserved[4];
	} allocFlags;
} CUmemAllocationProp;

/* CUmemPoolProps (cuMemPoolCreate): only the head is read. */
typedef struct {
	int allocType;
	int handleTypes;
	CUmemLocation location;
	void *win32SecurityAttributes;
	size_t maxSize;
	unsigned short usage;
	unsigned char reserved[54];
} CUmemPoolProps;

typedef struct {
	CUmemLocation location;
	int flags;
} CUmemAccessDesc;

/* CUarray_format values */
enum {
	CU_AD_FORMAT_UNSIGNED_INT8 = 0x01,
	CU_AD_FORMAT_UNSIGNED_INT16 = 0x02,
	CU_AD_FORMAT_UNSIGNED_INT32 = 0x03,
	CU_AD_FORMAT_SIGNED_INT8 = 0x08,
	CU_AD_FORMAT_SIGNED_INT16 = 0x09,
	CU_AD_FORMAT_SIGNED_INT32 = 0x0a,
	CU_AD_FORMAT_HALF = 0x10,
	CU_AD_FORMAT_FLOAT = 0x20,
};

typedef struct {
	size_t Width;
	size_t Height;
	int Format;		/* CUarray_format */
	unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR;

typedef struct {
	size_t Width;
	size_t Height;
	size_t Depth;
	int Format;		/* CUarray_format */
	unsigned int NumChannels;
	unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR;

/* ---- launches, events, graphs (the compute scheduler) ---- */

/* cuEventCreate flags */
#define CU_EVENT_DEFAULT		0x0
#define CU_EVENT_BLOCKING_SYNC		0x1
#define CU_EVENT_DISABLE_TIMING		0x2

/* CUstreamCaptureStatus (cuStreamIsCapturing) */
enum {
	CU_STREAM_CAPTURE_STATUS_NONE = 0,
	CU_STREAM_CAPTURE_STATUS_ACTIVE = 1,
	CU_STREAM_CAPTURE_STATUS_INVALIDATED = 2,
};

typedef struct CUlaunchAttribute_st CUlaunchAttribute;	/* not read */

/* cuLaunchKernelEx's configuration. */
typedef struct {
	unsigned int gridDimX, gridDimY, gridDimZ;
	unsigned int blockDimX, blockDimY, blockDimZ;
	unsigned int sharedMemBytes;
	CUstream hStream;
	CUlaunchAttribute *attrs;
	unsigned int numAttrs;
} CUlaunchConfig;

/* One device's launch in cuLaunchCooperativeKernelMultiDevice. */
typedef struct {
	CUfunction function;
	unsigned int gridDimX, gridDimY, gridDimZ;
	unsigned int blockDimX, blockDimY, blockDimZ;
	unsigned int sharedMemBytes;
	CUstream hStream;
	void **kernelParams;
} CUDA_LAUNCH_PARAMS;

/*
 * A graph's kernel node (cuGraphAddKernelNode): version 1's fields; the
 * _v2 structure adds a CUkernel and a CUcontext after them.
 */
typedef struct {
	CUfunction func;
	unsigned int gridDimX, gridDimY, gridDimZ;
	unsigned int blockDimX, blockDimY, blockDimZ;
	unsigned int sharedMemBytes;
	void **kernelParams;
	void **extra;
} CUDA_KERNEL_NODE_PARAMS;

typedef CUresult (*cuLaunchKernel_t)(CUfunction f, unsigned int gx, unsigned int gy,
				     unsigned int gz, unsigned int bx, unsigned int by,
				     unsigned int bz, unsigned int shared, CUstream s,
				     void **params, void **extra);
typedef CUresult (*cuLaunchKernelEx_t)(const CUlaunchConfig *config, CUfunction f,
				       void **params, void **extra);
typedef CUresult (*cuLaunchCooperativeKernel_t)(CUfunction f, unsigned int gx,
						unsigned int gy, unsigned int gz,
						unsigned int bx, unsigned int by,
						unsigned int bz, unsigned int shared,
						CUstream s, void **params);
typedef CUresult (*cuLaunchCooperativeKernelMultiDevice_t)(CUDA_LAUNCH_PARAMS *list,
							   unsigned int n,
							   unsigned int flags);
typedef CUresult (*cuGraphLaunch_t)(CUgraphExec exec, CUstream s);
typedef CUresult (*cuLaunchHostFunc_t)(CUstream s, CUhostFn fn, void *data);

#endif /* GPUSHARE_CUDA_ABI_H */
