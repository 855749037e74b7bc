#!/usr/bin/env python3
"""Runs a program with transparent huge pages off for it, as geogate turns
them off for itself: prctl(PR_SET_THP_DISABLE), which the kernel keeps
across execve. For comparing a bench binary with THP on and off:

    printf '#!/bin/sh\\nexec python3 benches/nothp.py %s "$@"\\n' "$PWD/$BIN" > /tmp/bench-nothp
    chmod +x /tmp/bench-nothp
    benches/alternate_binaries.sh 'in_process/pipeline_memory/2$' 5 "$BIN" /tmp/bench-nothp
"""
import ctypes
import os
import sys

PR_SET_THP_DISABLE = 41

if len(sys.argv) < 2:
    sys.exit("usage: nothp.py PROGRAM [ARGS...]")
if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_THP_DISABLE, ctypes.c_ulong(1), ctypes.c_ulong(0),
                                           ctypes.c_ulong(0), ctypes.c_ulong(0)) != 0:
    sys.exit(f"prctl(PR_SET_THP_DISABLE) failed: {os.strerror(ctypes.get_errno())}")
os.execv(sys.argv[1], sys.argv[1:])
