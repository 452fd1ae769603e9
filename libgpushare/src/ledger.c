// SPDX-License-Identifier: Apache-2.0
/*
 * The memory ledger (see ledger.h): the backend is chosen once, lazily, on
 * the first call that needs it.
 *
 *  - module: /dev/gpushare opens, GPUSHARE_IOC_QUERY answers with the
 *    container's quotas and GPUSHARE_IOC_MEM works.  The registration's
 *    quotas are in the container's GPU order, which is GPUSHARE_GPU_UUIDS's
 *    order, so CUDA device -> UUID -> position -> the module's GPU index.
 *    The quota is the module's (the environment's numbers are not used).
 *    The file and its ioctls: ledger_dev.c.
 *  - standalone: GPUSHARE_MEMORY_LIMIT, counted in this process.
 *  - off: GPUSHARE_ISOLATION=none, nothing configured, or a malformed
 *    environment (said once on stderr), when the module has no
 *    registration for the process; with one, the environment cannot turn
 *    the module's quotas off.
 *
 * A device is found by position: its UUID's place in GPUSHARE_GPU_UUIDS
 * (learnt by gs_ledger_attach), or, with no UUIDs given, its CUDA ordinal.
 *
 * fork: a child inherits the parent's descriptor, and with it the parent's
 * reservations (they belong to the open file).  The child's handler drops
 * the inherited descriptor and makes the next call choose the backend
 * again, so the child opens a file of its own.  It starts owning nothing:
 * the parent's device memory stays the parent's (a CUDA context does not
 * survive fork; the child cannot use or free it), and the container-wide
 * "used" the module reports still counts it, as long as the parent holds
 * it.  Standalone, the child counts from zero, as any new process does.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <uapi/gpushare.h>

#include "env.h"
#include "ledger.h"
#include "ledger_dev.h"

#define MAX_ORDINALS 64
#define SLOT_UNKNOWN (-1)	/* not attached yet */
#define SLOT_NONE (-2)		/* attached: not one of the container's GPUs */
#define SLOT_REFUSED (-3)	/* module mode: a device with no quota of its own */

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static bool ready;			/* backend chosen */
static enum gs_ledger_mode mode;
static struct gs_config cfg;		/* the environment */
static int nslots;			/* GPUs with a quota, by position */
static uint64_t quota[GS_MAX_GPUS];
static uint64_t used[GS_MAX_GPUS];	/* standalone: this process's use */
static int slot_of[MAX_ORDINALS];	/* ordinal -> position, or SLOT_* */
static char uuid_of[MAX_ORDINALS][GS_UUID_MAX];	/* attached ordinals */
static bool debug;
static uint64_t said_refused;		/* ordinals whose refusal was said */

static void child_after_fork(void)
{
	pthread_mutex_init(&lock, NULL);
	gs_dev_forget();
	ready = false;
	memset(used, 0, sizeof(used));
	said_refused = 0;
}

__attribute__((constructor)) static void ledger_setup(void)
{
	for (int i = 0; i < MAX_ORDINALS; i++)
		slot_of[i] = SLOT_UNKNOWN;
	pthread_atfork(NULL, NULL, child_after_fork);
}

/* @uuid's position in GPUSHARE_GPU_UUIDS, or SLOT_NONE. */
static int find_uuid(const char *uuid)
{
	int s = SLOT_NONE;

	for (int i = 0; i < cfg.nuuids; i++)
		if (gs_uuid_equal(cfg.uuids[i], uuid))
			s = i;
	return s;
}

/* Choose the backend; called with the lock held. */
static void choose(void)
{
	if (ready)
		return;
	ready = true;
	debug = getenv("GPUSHARE_DEBUG") != NULL;
	int bad = gs_config_parse(&cfg, getenv("GPUSHARE_GPU_UUIDS"),
				  getenv("GPUSHARE_MEMORY_LIMIT"), getenv("GPUSHARE_ISOLATION"));
	nslots = gs_dev_connect(quota);
	if (nslots) {
		/*
		 * The container is registered: its quotas are the module's, and
		 * the environment, which any process of the container can
		 * change for its children, neither turns them off
		 * (GPUSHARE_ISOLATION=none, a malformed GPUSHARE_MEMORY_LIMIT)
		 * nor sets them.  Only the UUIDs are read from it, for the
		 * device order; malformed, devices go by CUDA ordinal.
		 */
		mode = GS_LEDGER_MODULE;
		if (bad || cfg.off) {
			const char *u = getenv("GPUSHARE_GPU_UUIDS");
			memset(&cfg, 0, sizeof(cfg));
			cfg.nuuids = u && *u ? gs_parse_uuids(u, cfg.uuids, GS_MAX_GPUS) : 0;
			if (cfg.nuuids < 0)
				cfg.nuuids = 0;
		}
	} else if (bad) {
		fprintf(stderr, "gpushare: %s: GPU memory is not limited\n", cfg.error);
		mode = GS_LEDGER_OFF;
		return;
	} else if (cfg.off) {
		mode = GS_LEDGER_OFF;
	} else if (cfg.nlimits) {
		mode = GS_LEDGER_STANDALONE;
		nslots = cfg.nlimits;
		memcpy(quota, cfg.limits, sizeof(quota));
	} else {
		mode = GS_LEDGER_OFF;
	}
	/* Devices attached before (a forked child chooses again): their places. */
	for (int i = 0; i < MAX_ORDINALS; i++)
		if (slot_of[i] != SLOT_UNKNOWN)
			slot_of[i] = find_uuid(uuid_of[i]);
	if (debug) {
		static const char *const names[] = { "off", "module", "standalone" };
		char buf[GS_MAX_GPUS * 21 + 1] = "";
		for (int i = 0; i < nslots; i++)
			snprintf(buf + strlen(buf), sizeof(buf) - strlen(buf), "%s%" PRIu64,
				 i ? "," : "", quota[i]);
		fprintf(stderr, "gpushare: pid %d: ledger %s, quotas [%s] bytes, %s\n",
			(int)getpid(), names[mode], buf,
			cfg.nuuids ? "GPUs by UUID" : "GPUs by CUDA ordinal");
	}
}

/*
 * The position of @ordinal's quota; -1 when it has none (unlimited), or
 * SLOT_REFUSED in module mode, where a device must be one of the
 * container's: GPUSHARE_GPU_UUIDS has exactly as many entries as the
 * registration has quotas, and the device's UUID is one of them.  Anything
 * else (a device outside the list, a list rewritten to another length, or
 * malformed, a device whose UUID could not be read) fails closed.
 */
static int slot_locked(int ordinal)
{
	choose();
	if (mode == GS_LEDGER_OFF)
		return -1;
	if (mode == GS_LEDGER_MODULE) {
		if (cfg.nuuids != nslots || ordinal < 0 || ordinal >= MAX_ORDINALS)
			return SLOT_REFUSED;
		int slot = slot_of[ordinal];
		return slot >= 0 && slot < nslots ? slot : SLOT_REFUSED;
	}
	if (ordinal < 0 || ordinal >= MAX_ORDINALS)
		return -1;
	int slot = cfg.nuuids ? slot_of[ordinal] : ordinal;
	return slot >= 0 && slot < nslots ? slot : -1;
}

/* Say once per device why its allocations are refused; lock held. */
static void say_refused(int ordinal)
{
	uint64_t bit = ordinal >= 0 && ordinal < MAX_ORDINALS ? 1ull << ordinal : 1ull << 63;

	if (said_refused & bit)
		return;
	said_refused |= bit;
	if (cfg.nuuids != nslots)
		fprintf(stderr, "gpushare: GPU memory allocation refused on CUDA device %d: "
			"GPUSHARE_GPU_UUIDS lists %d GPUs, this container has %d registered, so "
			"no device can be matched to its quota\n", ordinal, cfg.nuuids, nslots);
	else if (ordinal >= 0 && ordinal < MAX_ORDINALS && slot_of[ordinal] == SLOT_NONE)
		fprintf(stderr, "gpushare: GPU memory allocation refused on CUDA device %d: "
			"%s is not one of this container's GPUs (GPUSHARE_GPU_UUIDS)\n",
			ordinal, uuid_of[ordinal]);
	else
		fprintf(stderr, "gpushare: GPU memory allocation refused on CUDA device %d: "
			"its UUID is unknown, so it cannot be matched to this container's GPUs\n",
			ordinal);
}

static int slot(int ordinal)
{
	pthread_mutex_lock(&lock);
	int s = slot_locked(ordinal);
	pthread_mutex_unlock(&lock);
	return s;
}

enum gs_ledger_mode gs_ledger_mode(void)
{
	pthread_mutex_lock(&lock);
	choose();
	enum gs_ledger_mode m = mode;
	pthread_mutex_unlock(&lock);
	return m;
}

void gs_ledger_attach(int ordinal, const unsigned char uuid[16])
{
	if (ordinal < 0 || ordinal >= MAX_ORDINALS)
		return;
	pthread_mutex_lock(&lock);
	choose();
	gs_format_uuid(uuid, uuid_of[ordinal]);
	slot_of[ordinal] = find_uuid(uuid_of[ordinal]);
	pthread_mutex_unlock(&lock);
}

/* Quota and use at position @s (>= 0); false when the module cannot say. */
static bool view_slot(int s, uint64_t *q, uint64_t *u)
{
	if (s == SLOT_REFUSED) {	/* nothing may be allocated there */
		*q = 0;
		*u = 0;
		return true;
	}
	if (s < 0)
		return false;
	pthread_mutex_lock(&lock);
	enum gs_ledger_mode m = mode;
	*q = quota[s];
	*u = used[s];
	pthread_mutex_unlock(&lock);
	if (m == GS_LEDGER_MODULE) {
		struct gpushare_mem mem;
		if (gs_dev_mem(GPUSHARE_MEM_INFO, s, 0, &mem))
			return false;
		*q = mem.quota;
		*u = mem.used;
	}
	return true;
}

bool gs_ledger_refused(int ordinal)
{
	return slot(ordinal) == SLOT_REFUSED;
}

bool gs_ledger_quota(int ordinal, uint64_t *q)
{
	uint64_t u;
	return view_slot(slot(ordinal), q, &u);
}

bool gs_ledger_view(int ordinal, uint64_t *q, uint64_t *u)
{
	return view_slot(slot(ordinal), q, u);
}

bool gs_ledger_view_uuid(const char *uuid, uint64_t *q, uint64_t *u)
{
	int s = -1;

	pthread_mutex_lock(&lock);
	choose();
	if (mode == GS_LEDGER_MODULE) {
		/* As slot_locked: a GPU that is not the container's shows nothing. */
		s = cfg.nuuids == nslots ? find_uuid(uuid) : SLOT_REFUSED;
		if (s < 0 || s >= nslots)
			s = SLOT_REFUSED;
	} else if (mode != GS_LEDGER_OFF) {
		for (int i = 0; i < cfg.nuuids && s < 0; i++)
			if (gs_uuid_equal(cfg.uuids[i], uuid))
				s = i;
		/* No UUIDs given: a device is known by the one it was attached with. */
		for (int i = 0; !cfg.nuuids && i < MAX_ORDINALS && s < 0; i++)
			if (gs_uuid_equal(uuid_of[i], uuid))
				s = i;
		if (s >= nslots)
			s = -1;
	}
	pthread_mutex_unlock(&lock);
	return view_slot(s, q, u);
}

int gs_ledger_reserve(int ordinal, uint64_t bytes)
{
	struct gpushare_mem m;
	int ret = 0;

	pthread_mutex_lock(&lock);
	int s = slot_locked(ordinal);
	if (s == SLOT_REFUSED) {
		say_refused(ordinal);
		pthread_mutex_unlock(&lock);
		return -1;
	}
	if (s >= 0 && bytes && mode == GS_LEDGER_STANDALONE) {
		if (bytes > quota[s] - used[s])
			ret = -1;
		else
			used[s] += bytes;
	}
	pthread_mutex_unlock(&lock);
	if (s < 0 || !bytes || mode != GS_LEDGER_MODULE)
		return ret;
	if (gs_dev_mem(GPUSHARE_MEM_RESERVE, s, bytes, &m) == 0)
		return 0;
	/*
	 * EDQUOT; ENXIO (no quota on a GPU the registration named when we
	 * matched it: fail closed, as for a device outside the list); or the
	 * ledger cannot be asked (container gone): refuse.
	 */
	if (debug && errno != EDQUOT)
		fprintf(stderr, "gpushare: reserve on GPU %u: %s\n", gs_dev_gpu(s),
			strerror(errno));
	return -1;
}

void gs_ledger_release(int ordinal, uint64_t bytes)
{
	struct gpushare_mem m;

	pthread_mutex_lock(&lock);
	int s = slot_locked(ordinal);
	if (s >= 0 && mode == GS_LEDGER_STANDALONE)
		used[s] -= bytes < used[s] ? bytes : used[s];
	pthread_mutex_unlock(&lock);
	if (s >= 0 && bytes && mode == GS_LEDGER_MODULE)
		gs_dev_mem(GPUSHARE_MEM_RELEASE, s, bytes, &m);
}

bool gs_ledger_uuid(int ordinal, char out[GS_UUID_MAX])
{
	bool ok = false;

	if (ordinal < 0 || ordinal >= MAX_ORDINALS)
		return false;
	pthread_mutex_lock(&lock);
	if (slot_of[ordinal] != SLOT_UNKNOWN) {
		memcpy(out, uuid_of[ordinal], GS_UUID_MAX);
		ok = true;
	}
	pthread_mutex_unlock(&lock);
	return ok;
}

int gs_ledger_weights(uint32_t *out, int max)
{
	pthread_mutex_lock(&lock);
	choose();
	int n = mode == GS_LEDGER_MODULE ? nslots : 0;
	if (n > max)
		n = max;
	gs_dev_weights(out, n);
	pthread_mutex_unlock(&lock);
	return n;
}

int gs_ledger_reopen(void)
{
	int ret = -1;

	pthread_mutex_lock(&lock);
	choose();
	if (mode == GS_LEDGER_MODULE && gs_dev_reconnect(quota, &nslots) == 0) {
		for (int i = 0; i < MAX_ORDINALS; i++)
			if (slot_of[i] != SLOT_UNKNOWN)
				slot_of[i] = find_uuid(uuid_of[i]);
		ret = 0;
	}
	pthread_mutex_unlock(&lock);
	return ret;
}

int gs_ledger_sched(int ordinal, struct gpushare_sched *sc)
{
	pthread_mutex_lock(&lock);
	int s = slot_locked(ordinal);
	bool module = mode == GS_LEDGER_MODULE;
	int f = gs_dev_fd();
	pthread_mutex_unlock(&lock);
	if (!module) {
		errno = ENOSYS;
		return -1;
	}
	if (s < 0) {
		errno = ENODEV;
		return -1;
	}
	return gs_dev_sched(f, s, sc);
}
