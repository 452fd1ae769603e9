// SPDX-License-Identifier: Apache-2.0
/*
 * gpushare-front: gpushare-runc (a drop-in runc) and, given "hook" first,
 * the CDI spec's OCI hooks; one binary for both.
 */
#include <string.h>

#include "front.h"

int main(int argc, char **argv)
{
	if (argc > 1 && !strcmp(argv[1], "hook"))
		return hook_main(argc - 2, argv + 2);
	return runc_main(argc, argv);
}
