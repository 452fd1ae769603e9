// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
/*
 * User-space unit tests of gs_sched.c, the compute scheduler core, driven
 * by a discrete-event simulation in simulated time: containers with one
 * or more processes that ask for the GPU, run work on a serial simulated
 * GPU while granted, and release it with the GPU time their work took.
 * Each policy's rule is checked as a number (shares over a simulated
 * minute, latencies).  Prints every number, then "N passed, M failed".
 * The simulation is in test_sched_sim.c, the tests in test_sched_*.c.
 */
#include "test_sched.h"

int main(void)
{
	test_fair_share();
	test_preemptive();
	test_weighted();
	test_fixed();
	test_weak();
	test_native();
	test_highprio();
	test_graphs();
	test_live_settings();
	test_switch();
	test_stopped();
	test_hostile();
	test_offer_grief();
	test_idle_late();
	test_detach_wakes();
	test_drain_bounds();
	test_extend();
	test_renew();
	test_refund_conservation();
	test_free_slice();
	test_late_reacquire();
	test_refund_keeps_gputime();
	printf("%d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
