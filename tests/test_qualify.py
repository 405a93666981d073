"""Node qualification (edgesched.edge.qualify): the built-in probes for real, the report's JSON
round trip, the sysbench/fio parsers against real captured output, and failure handling.

The built-in probes run on this machine with tiny durations. The sysbench and fio paths run
against the real tools only when installed (skipped otherwise); stub executables that print the
captured samples below exercise the orchestration either way.
"""

# ruff: noqa: E501  (the embedded tool output is verbatim, long lines included)

from __future__ import annotations

import json
import math
import os
import shutil
import stat
import time
from pathlib import Path

import pytest

from edgesched.edge import qualify as q
from edgesched.edge.qualify import (
    CacheLevel,
    Measurement,
    QualificationReport,
    SweepPoint,
    cache_sweep,
    cpu_probe,
    find_knees,
    last_level_cache,
    memory_bandwidth,
    parse_fio_json,
    parse_sysbench_cpu,
    qualify,
    read_cache_levels,
    render_text,
)

# ----------------------------------------------------------------------------- captured output
# Real tool output, verbatim, from public sources:
# - `sysbench cpu --cpu-max-prime=20000 --threads=4 run` on a Raspberry Pi 5 (sysbench 1.0.20),
#   from a benchmark notes README on GitHub.
# - `sysbench --threads=8 --time=30 cpu --cpu-max-prime=64000 run` (sysbench 1.1.0), from the
#   Cloud Mercato blog post "Why you should use sysbench".
# - fio 3.20 `--output-format=json` of a randread job and a randwrite job (ioengine=libaio,
#   direct=1, gtod_reduce=1 so no latencies), a test fixture of a Go fio wrapper on GitHub; its
#   tab indentation is shown here as spaces (JSON whitespace, same document).
# - fio 3.42 `--output-format=json,normal` of a randwrite job on NVMe: progress lines before the
#   JSON document and the normal report after it, from a Ceph CBT results capture on GitHub.

SYSBENCH_1_0_20 = """\
sysbench 1.0.20 (using system LuaJIT 2.1.0-beta3)

Running the test with following options:
Number of threads: 4
Initializing random number generator from current time


Prime numbers limit: 20000

Initializing worker threads...

Threads started!

CPU speed:
    events per second:  4128.44

General statistics:
    total time:                          10.0010s
    total number of events:              41295

Latency (ms):
         min:                                    0.96
         avg:                                    0.97
         max:                                   10.02
         95th percentile:                        0.97
         sum:                                39994.74

Threads fairness:
    events (avg/stddev):           10323.7500/20.90
    execution time (avg/stddev):   9.9987/0.00
"""

SYSBENCH_1_1_0 = """\
sysbench 1.1.0 (using bundled LuaJIT 2.1.0-beta3)

Running the test with following options:
Number of threads: 8
Initializing random number generator from current time


Prime numbers limit: 64000

Initializing worker threads...

Threads started!

CPU speed:
    events per second:   707.94

Throughput:
    events/s (eps):                      707.9361
    time elapsed:                        30.0112s
    total number of events:              21246

Latency (ms):
         min:                                   11.25
         avg:                                   11.30
         max:                                   19.08
         95th percentile:                       11.24
         sum:                               240041.14

Threads fairness:
    events (avg/stddev):           2655.7500/1.79
    execution time (avg/stddev):   30.0051/0.00
"""

FIO_3_20_JSON = """\
{
    "fio version" : "fio-3.20",
    "timestamp" : 1611952282,
    "timestamp_ms" : 1611952282240,
    "time" : "Fri Jan 29 20:31:22 2021",
    "global options" : {
      "directory" : "/dataset",
      "randrepeat" : "0",
      "verify" : "0",
      "ioengine" : "libaio",
      "direct" : "1",
      "gtod_reduce" : "1"
    },
    "jobs" : [
      {
        "jobname" : "read_iops",
        "groupid" : 0,
        "error" : 0,
        "eta" : 0,
        "elapsed" : 18,
        "job options" : {
          "name" : "read_iops",
          "bs" : "4K",
          "iodepth" : "64",
          "size" : "2G",
          "rw" : "randread",
          "ramp_time" : "2s",
          "runtime" : "15s"
        },
        "read" : {
          "io_bytes" : 61886464,
          "io_kbytes" : 60436,
          "bw_bytes" : 4039322,
          "bw" : 3944,
          "iops" : 982.050780,
          "runtime" : 15321,
          "total_ios" : 15046,
          "short_ios" : 0,
          "drop_ios" : 0,
          "slat_ns" : {
            "min" : 0,
            "max" : 0,
            "mean" : 0.000000,
            "stddev" : 0.000000,
            "N" : 0
          },
          "clat_ns" : {
            "min" : 0,
            "max" : 0,
            "mean" : 0.000000,
            "stddev" : 0.000000,
            "N" : 0
          },
          "lat_ns" : {
            "min" : 0,
            "max" : 0,
            "mean" : 0.000000,
            "stddev" : 0.000000,
            "N" : 0
          },
          "bw_min" : 1919,
          "bw_max" : 7664,
          "bw_agg" : 100.000000,
          "bw_mean" : 3995.000000,
          "bw_dev" : 1200.820783,
          "bw_samples" : 30,
          "iops_min" : 479,
          "iops_max" : 1916,
          "iops_mean" : 998.566667,
          "iops_stddev" : 300.247677,
          "iops_samples" : 30
        },
        "write" : {
          "io_bytes" : 0,
          "io_kbytes" : 0,
          "bw_bytes" : 0,
          "bw" : 0,
          "iops" : 0.000000,
          "runtime" : 0,
          "total_ios" : 0,
          "short_ios" : 0,
          "drop_ios" : 0,
          "slat_ns" : {
            "min" : 0,
            "max" : 0,
            "mean" : 0.000000,
            "stddev" : 0.000000,
            "N" : 0
          },
          "clat_ns" : {
            "min" : 0,
            "max" : 0,
            "mean" : 0.000000,
            "stddev" : 0.000000,
            "N" : 0
          },
          "lat_ns" : {
            "min" : 0,
            "max" : 0,
            "mean" : 0.000000,
            "stddev" : 0.000000,
            "N" : 0
          },
          "bw_min" : 0,
          "bw_max" : 0,
          "bw_agg" : 0.000000,
          "bw_mean" : 0.000000,
          "bw_dev" : 0.000000,
          "bw_samples" : 0,
          "iops_min" : 0,
          "iops_max" : 0,
          "iops_mean" : 0.000000,
          "iops_stddev" : 0.000000,
          "iops_samples" : 0
        },
        "trim" : {
          "io_bytes" : 0,
          "io_kbytes" : 0,
          "bw_bytes" : 0,
          "bw" : 0,
          "iops" : 0.000000,
          "runtime" : 0,
          "total_ios" : 0,
          "short_ios" : 0,
          "drop_ios" : 0,
          "slat_ns" : {
            "min" : 0,
            "max" : 0,
            "mean" : 0.000000,
            "stddev" : 0.000000,
            "N" : 0
          },
          "clat_ns" : {
            "min" : 0,
            "max" : 0,
            "mean" : 0.000000,
            "stddev" : 0.000000,
            "N" : 0
          },
          "lat_ns" : {
            "min" : 0,
            "max" : 0,
            "mean" : 0.000000,
            "stddev" : 0.000000,
            "N" : 0
          },
          "bw_min" : 0,
          "bw_max" : 0,
          "bw_agg" : 0.000000,
          "bw_mean" : 0.000000,
          "bw_dev" : 0.000000,
          "bw_samples" : 0,
          "iops_min" : 0,
          "iops_max" : 0,
          "iops_mean" : 0.000000,
          "iops_stddev" : 0.000000,
          "iops_samples" : 0
        },
        "sync" : {
          "total_ios" : 0,
          "lat_ns" : {
            "min" : 0,
            "max" : 0,
            "mean" : 0.000000,
            "stddev" : 0.000000,
            "N" : 0
          }
        },
        "job_runtime" : 15322,
        "usr_cpu" : 1.109516,
        "sys_cpu" : 3.648349,
        "ctx" : 17991,
        "majf" : 1,
        "minf" : 62,
        "iodepth_level" : {
          "1" : 0.000000,
          "2" : 0.000000,
          "4" : 0.000000,
          "8" : 0.000000,
          "16" : 0.000000,
          "32" : 0.000000,
          ">=64" : 100.000000
        },
        "iodepth_submit" : {
          "0" : 0.000000,
          "4" : 100.000000,
          "8" : 0.000000,
          "16" : 0.000000,
          "32" : 0.000000,
          "64" : 0.000000,
          ">=64" : 0.000000
        },
        "iodepth_complete" : {
          "0" : 0.000000,
          "4" : 99.993354,
          "8" : 0.000000,
          "16" : 0.000000,
          "32" : 0.000000,
          "64" : 0.100000,
          ">=64" : 0.000000
        },
        "latency_ns" : {
          "2" : 0.000000,
          "4" : 0.000000,
          "10" : 0.000000,
          "20" : 0.000000,
          "50" : 0.000000,
          "100" : 0.000000,
          "250" : 0.000000,
          "500" : 0.000000,
          "750" : 0.000000,
          "1000" : 0.000000
        },
        "latency_us" : {
          "2" : 0.000000,
          "4" : 0.000000,
          "10" : 0.000000,
          "20" : 0.000000,
          "50" : 0.000000,
          "100" : 0.000000,
          "250" : 0.000000,
          "500" : 0.000000,
          "750" : 0.000000,
          "1000" : 0.000000
        },
        "latency_ms" : {
          "2" : 0.000000,
          "4" : 0.000000,
          "10" : 0.000000,
          "20" : 0.000000,
          "50" : 0.000000,
          "100" : 0.000000,
          "250" : 0.000000,
          "500" : 0.000000,
          "750" : 0.000000,
          "1000" : 0.000000,
          "2000" : 0.000000,
          ">=2000" : 0.000000
        },
        "latency_depth" : 64,
        "latency_target" : 0,
        "latency_percentile" : 100.000000,
        "latency_window" : 0
      },
      {
        "jobname" : "write_iops",
        "groupid" : 0,
        "error" : 0,
        "eta" : 0,
        "elapsed" : 18,
        "job options" : {
          "name" : "write_iops",
          "bs" : "4K",
          "iodepth" : "64",
          "size" : "2G",
          "rw" : "randwrite",
          "ramp_time" : "2s",
          "runtime" : "15s"
        },
        "read" : {
          "io_bytes" : 0,
          "io_kbytes" : 0,
          "bw_bytes" : 0,
          "bw" : 0,
          "iops" : 0.000000,
          "runtime" : 0,
          "total_ios" : 0,
          "short_ios" : 0,
          "drop_ios" : 0,
          "slat_ns" : {
            "min" : 0,
            "max" : 0,
            "mean" : 0.000000,
            "stddev" : 0.000000,
            "N" : 0
          },
          "clat_ns" : {
            "min" : 0,
            "max" : 0,
            "mean" : 0.000000,
            "stddev" : 0.000000,
            "N" : 0
          },
          "lat_ns" : {
            "min" : 0,
            "max" : 0,
            "mean" : 0.000000,
            "stddev" : 0.000000,
            "N" : 0
          },
          "bw_min" : 0,
          "bw_max" : 0,
          "bw_agg" : 0.000000,
          "bw_mean" : 0.000000,
          "bw_dev" : 0.000000,
          "bw_samples" : 0,
          "iops_min" : 0,
          "iops_max" : 0,
          "iops_mean" : 0.000000,
          "iops_stddev" : 0.000000,
          "iops_samples" : 0
        },
        "write" : {
          "io_bytes" : 24805376,
          "io_kbytes" : 24224,
          "bw_bytes" : 1616406,
          "bw" : 1578,
          "iops" : 390.525218,
          "runtime" : 15346,
          "total_ios" : 5993,
          "short_ios" : 0,
          "drop_ios" : 0,
          "slat_ns" : {
            "min" : 0,
            "max" : 0,
            "mean" : 0.000000,
            "stddev" : 0.000000,
            "N" : 0
          },
          "clat_ns" : {
            "min" : 0,
            "max" : 0,
            "mean" : 0.000000,
            "stddev" : 0.000000,
            "N" : 0
          },
          "lat_ns" : {
            "min" : 0,
            "max" : 0,
            "mean" : 0.000000,
            "stddev" : 0.000000,
            "N" : 0
          },
          "bw_min" : 512,
          "bw_max" : 2706,
          "bw_agg" : 100.000000,
          "bw_mean" : 1581.066667,
          "bw_dev" : 476.641189,
          "bw_samples" : 30,
          "iops_min" : 128,
          "iops_max" : 676,
          "iops_mean" : 395.033333,
          "iops_stddev" : 119.151738,
          "iops_samples" : 30
        },
        "trim" : {
          "io_bytes" : 0,
          "io_kbytes" : 0,
          "bw_bytes" : 0,
          "bw" : 0,
          "iops" : 0.000000,
          "runtime" : 0,
          "total_ios" : 0,
          "short_ios" : 0,
          "drop_ios" : 0,
          "slat_ns" : {
            "min" : 0,
            "max" : 0,
            "mean" : 0.000000,
            "stddev" : 0.000000,
            "N" : 0
          },
          "clat_ns" : {
            "min" : 0,
            "max" : 0,
            "mean" : 0.000000,
            "stddev" : 0.000000,
            "N" : 0
          },
          "lat_ns" : {
            "min" : 0,
            "max" : 0,
            "mean" : 0.000000,
            "stddev" : 0.000000,
            "N" : 0
          },
          "bw_min" : 0,
          "bw_max" : 0,
          "bw_agg" : 0.000000,
          "bw_mean" : 0.000000,
          "bw_dev" : 0.000000,
          "bw_samples" : 0,
          "iops_min" : 0,
          "iops_max" : 0,
          "iops_mean" : 0.000000,
          "iops_stddev" : 0.000000,
          "iops_samples" : 0
        },
        "sync" : {
          "total_ios" : 0,
          "lat_ns" : {
            "min" : 0,
            "max" : 0,
            "mean" : 0.000000,
            "stddev" : 0.000000,
            "N" : 0
          }
        },
        "job_runtime" : 15345,
        "usr_cpu" : 0.508309,
        "sys_cpu" : 2.280873,
        "ctx" : 7411,
        "majf" : 1,
        "minf" : 63,
        "iodepth_level" : {
          "1" : 0.000000,
          "2" : 0.000000,
          "4" : 0.000000,
          "8" : 0.000000,
          "16" : 0.000000,
          "32" : 0.000000,
          ">=64" : 100.000000
        },
        "iodepth_submit" : {
          "0" : 0.000000,
          "4" : 100.000000,
          "8" : 0.000000,
          "16" : 0.000000,
          "32" : 0.000000,
          "64" : 0.000000,
          ">=64" : 0.000000
        },
        "iodepth_complete" : {
          "0" : 0.000000,
          "4" : 99.983317,
          "8" : 0.000000,
          "16" : 0.000000,
          "32" : 0.000000,
          "64" : 0.100000,
          ">=64" : 0.000000
        },
        "latency_ns" : {
          "2" : 0.000000,
          "4" : 0.000000,
          "10" : 0.000000,
          "20" : 0.000000,
          "50" : 0.000000,
          "100" : 0.000000,
          "250" : 0.000000,
          "500" : 0.000000,
          "750" : 0.000000,
          "1000" : 0.000000
        },
        "latency_us" : {
          "2" : 0.000000,
          "4" : 0.000000,
          "10" : 0.000000,
          "20" : 0.000000,
          "50" : 0.000000,
          "100" : 0.000000,
          "250" : 0.000000,
          "500" : 0.000000,
          "750" : 0.000000,
          "1000" : 0.000000
        },
        "latency_ms" : {
          "2" : 0.000000,
          "4" : 0.000000,
          "10" : 0.000000,
          "20" : 0.000000,
          "50" : 0.000000,
          "100" : 0.000000,
          "250" : 0.000000,
          "500" : 0.000000,
          "750" : 0.000000,
          "1000" : 0.000000,
          "2000" : 0.000000,
          ">=2000" : 0.000000
        },
        "latency_depth" : 64,
        "latency_target" : 0,
        "latency_percentile" : 100.000000,
        "latency_window" : 0
      }
    ],
    "disk_util" : [
      {
        "name" : "rbd4",
        "read_ios" : 16957,
        "write_ios" : 6896,
        "read_merges" : 0,
        "write_merges" : 207,
        "read_ticks" : 1072290,
        "write_ticks" : 1043421,
        "in_queue" : 2119036,
        "util" : 99.712875
      }
    ]
  }
"""

FIO_3_42_JSON_NORMAL = """\
/dev/nvme8n6: (g=0): rw=randwrite, bs=(R) 4096B-4096B, (W) 4096B-4096B, (T) 4096B-4096B, ioengine=libaio, iodepth=8
fio-3.42-6-g219f
Starting 1 process
{
  "fio version" : "fio-3.42-6-g219f",
  "timestamp" : 1783516279,
  "timestamp_ms" : 1783516279845,
  "time" : "Wed Jul  8 09:11:19 2026",
  "global options" : {
    "rw" : "randwrite",
    "ioengine" : "libaio",
    "runtime" : "10",
    "ramp_time" : "10",
    "numjobs" : "1",
    "direct" : "1",
    "bs" : "4096B",
    "iodepth" : "8",
    "write_iops_log" : "/tmp/cbt/00000000/RawFio/osd_ra-00004096/op_size-00004096/concurrent_procs-016/randwrite/iodepth-008/output.5",
    "write_bw_log" : "/tmp/cbt/00000000/RawFio/osd_ra-00004096/op_size-00004096/concurrent_procs-016/randwrite/iodepth-008/output.5",
    "write_lat_log" : "/tmp/cbt/00000000/RawFio/osd_ra-00004096/op_size-00004096/concurrent_procs-016/randwrite/iodepth-008/output.5"
  },
  "jobs" : [
    {
      "jobname" : "/dev/nvme8n6",
      "groupid" : 0,
      "job_start" : 1783516269595,
      "error" : 0,
      "eta" : 0,
      "elapsed" : 22,
      "job options" : {
        "name" : "/dev/nvme8n6"
      },
      "read" : {
        "io_bytes" : 0,
        "io_kbytes" : 0,
        "bw_bytes" : 0,
        "bw" : 0,
        "iops" : 0.000000,
        "runtime" : 0,
        "total_ios" : 0,
        "short_ios" : 0,
        "drop_ios" : 0,
        "slat_ns" : {
          "min" : 0,
          "max" : 0,
          "mean" : 0.000000,
          "stddev" : 0.000000,
          "N" : 0
        },
        "clat_ns" : {
          "min" : 0,
          "max" : 0,
          "mean" : 0.000000,
          "stddev" : 0.000000,
          "N" : 0
        },
        "lat_ns" : {
          "min" : 0,
          "max" : 0,
          "mean" : 0.000000,
          "stddev" : 0.000000,
          "N" : 0
        },
        "bw_min" : 0,
        "bw_max" : 0,
        "bw_agg" : 0.000000,
        "bw_mean" : 0.000000,
        "bw_dev" : 0.000000,
        "bw_samples" : 0,
        "iops_min" : 0,
        "iops_max" : 0,
        "iops_mean" : 0.000000,
        "iops_stddev" : 0.000000,
        "iops_samples" : 0
      },
      "write" : {
        "io_bytes" : 131194880,
        "io_kbytes" : 128120,
        "bw_bytes" : 13116864,
        "bw" : 12809,
        "iops" : 3201.659668,
        "runtime" : 10002,
        "total_ios" : 32023,
        "short_ios" : 0,
        "drop_ios" : 0,
        "slat_ns" : {
          "min" : 1332,
          "max" : 518422,
          "mean" : 6455.719358,
          "stddev" : 4135.428598,
          "N" : 32023
        },
        "clat_ns" : {
          "min" : 794610,
          "max" : 16898898,
          "mean" : 2486019.027849,
          "stddev" : 773033.868604,
          "N" : 32030,
          "percentile" : {
            "1.000000" : 1220608,
            "5.000000" : 1482752,
            "10.000000" : 1646592,
            "20.000000" : 1859584,
            "30.000000" : 2039808,
            "40.000000" : 2211840,
            "50.000000" : 2375680,
            "60.000000" : 2539520,
            "70.000000" : 2768896,
            "80.000000" : 3031040,
            "90.000000" : 3457024,
            "95.000000" : 3883008,
            "99.000000" : 4751360,
            "99.500000" : 5210112,
            "99.900000" : 6127616,
            "99.950000" : 7831552,
            "99.990000" : 11993088
          }
        },
        "lat_ns" : {
          "min" : 800360,
          "max" : 16908544,
          "mean" : 2492474.939713,
          "stddev" : 772991.330043,
          "N" : 32030
        },
        "bw_min" : 242,
        "bw_max" : 5154,
        "bw_agg" : 14.013106,
        "bw_mean" : 1795.900968,
        "bw_dev" : 531.195007,
        "bw_samples" : 32030,
        "iops_min" : 1,
        "iops_max" : 1,
        "iops_mean" : 1.000000,
        "iops_stddev" : 0.000000,
        "iops_samples" : 32030
      },
      "trim" : {
        "io_bytes" : 0,
        "io_kbytes" : 0,
        "bw_bytes" : 0,
        "bw" : 0,
        "iops" : 0.000000,
        "runtime" : 0,
        "total_ios" : 0,
        "short_ios" : 0,
        "drop_ios" : 0,
        "slat_ns" : {
          "min" : 0,
          "max" : 0,
          "mean" : 0.000000,
          "stddev" : 0.000000,
          "N" : 0
        },
        "clat_ns" : {
          "min" : 0,
          "max" : 0,
          "mean" : 0.000000,
          "stddev" : 0.000000,
          "N" : 0
        },
        "lat_ns" : {
          "min" : 0,
          "max" : 0,
          "mean" : 0.000000,
          "stddev" : 0.000000,
          "N" : 0
        },
        "bw_min" : 0,
        "bw_max" : 0,
        "bw_agg" : 0.000000,
        "bw_mean" : 0.000000,
        "bw_dev" : 0.000000,
        "bw_samples" : 0,
        "iops_min" : 0,
        "iops_max" : 0,
        "iops_mean" : 0.000000,
        "iops_stddev" : 0.000000,
        "iops_samples" : 0
      },
      "sync" : {
        "total_ios" : 0,
        "lat_ns" : {
          "min" : 0,
          "max" : 0,
          "mean" : 0.000000,
          "stddev" : 0.000000,
          "N" : 0
        }
      },
      "job_runtime" : 10001,
      "usr_cpu" : 1.649835,
      "sys_cpu" : 2.569743,
      "ctx" : 27483,
      "majf" : 0,
      "minf" : 2754,
      "iodepth_level" : {
        "1" : 0.100000,
        "2" : 0.100000,
        "4" : 0.100000,
        "8" : 99.890704,
        "16" : 0.000000,
        "32" : 0.000000,
        ">=64" : 0.000000
      },
      "iodepth_submit" : {
        "0" : 0.000000,
        "4" : 100.000000,
        "8" : 0.000000,
        "16" : 0.000000,
        "32" : 0.000000,
        "64" : 0.000000,
        ">=64" : 0.000000
      },
      "iodepth_complete" : {
        "0" : 0.000000,
        "4" : 99.996877,
        "8" : 0.100000,
        "16" : 0.000000,
        "32" : 0.000000,
        "64" : 0.000000,
        ">=64" : 0.000000
      },
      "latency_ns" : {
        "2" : 0.000000,
        "4" : 0.000000,
        "10" : 0.000000,
        "20" : 0.000000,
        "50" : 0.000000,
        "100" : 0.000000,
        "250" : 0.000000,
        "500" : 0.000000,
        "750" : 0.000000,
        "1000" : 0.000000
      },
      "latency_us" : {
        "2" : 0.000000,
        "4" : 0.000000,
        "10" : 0.000000,
        "20" : 0.000000,
        "50" : 0.000000,
        "100" : 0.000000,
        "250" : 0.000000,
        "500" : 0.000000,
        "750" : 0.000000,
        "1000" : 0.118665
      },
      "latency_ms" : {
        "2" : 27.627018,
        "4" : 68.266558,
        "10" : 3.975268,
        "20" : 0.034350,
        "50" : 0.000000,
        "100" : 0.000000,
        "250" : 0.000000,
        "500" : 0.000000,
        "750" : 0.000000,
        "1000" : 0.000000,
        "2000" : 0.000000,
        ">=2000" : 0.000000
      },
      "latency_depth" : 8,
      "latency_target" : 0,
      "latency_target_ns" : 0,
      "latency_percentile" : 100.000000,
      "latency_window" : 0,
      "latency_window_us" : 0
    }
  ],
  "disk_util" : [
    {
      "name" : "nvme8n6",
      "read_ios" : 0,
      "write_ios" : 65981,
      "read_sectors" : 0,
      "write_sectors" : 527848,
      "read_merges" : 0,
      "write_merges" : 0,
      "read_ticks" : 0,
      "write_ticks" : 164146,
      "in_queue" : 164146,
      "util" : 99.494171
    }
  ]
}

/dev/nvme8n6: (groupid=0, jobs=1): err= 0: pid=473225: Wed Jul  8 09:11:19 2026
  write: IOPS=3201, BW=12.5MiB/s (13.1MB/s)(125MiB/10002msec)
    slat (nsec): min=1332, max=518422, avg=6455.72, stdev=4135.43
    clat (usec): min=794, max=16898, avg=2486.02, stdev=773.03
     lat (usec): min=800, max=16908, avg=2492.47, stdev=772.99
    clat percentiles (usec):
     |  1.00th=[ 1221],  5.00th=[ 1483], 10.00th=[ 1647], 20.00th=[ 1860],
     | 30.00th=[ 2040], 40.00th=[ 2212], 50.00th=[ 2376], 60.00th=[ 2540],
     | 70.00th=[ 2769], 80.00th=[ 3032], 90.00th=[ 3458], 95.00th=[ 3884],
     | 99.00th=[ 4752], 99.50th=[ 5211], 99.90th=[ 6128], 99.95th=[ 7832],
     | 99.99th=[11994]
   bw (  KiB/s): min=  242, max= 5154, per=14.01%, avg=1795.90, stdev=531.20, samples=32030
   iops        : min=    1, max=    1, avg= 1.00, stdev= 0.00, samples=32030
  lat (usec)   : 1000=0.12%
  lat (msec)   : 2=27.63%, 4=68.27%, 10=3.98%, 20=0.03%
  cpu          : usr=1.65%, sys=2.57%, ctx=27483, majf=0, minf=2754
  IO depths    : 1=0.1%, 2=0.1%, 4=0.1%, 8=99.9%, 16=0.0%, 32=0.0%, >=64=0.0%
     submit    : 0=0.0%, 4=100.0%, 8=0.0%, 16=0.0%, 32=0.0%, 64=0.0%, >=64=0.0%
     complete  : 0=0.0%, 4=100.0%, 8=0.1%, 16=0.0%, 32=0.0%, 64=0.0%, >=64=0.0%
     issued rwts: total=0,32023,0,0 short=0,0,0,0 dropped=0,0,0,0
     latency   : target=0.00ns, window=0.00ns, percentile=100.00%, depth=8

Run status group 0 (all jobs):
  WRITE: bw=12.5MiB/s (13.1MB/s), 12.5MiB/s-12.5MiB/s (13.1MB/s-13.1MB/s), io=125MiB (131MB), run=10002-10002msec

Disk stats (read/write):
  nvme8n6: ios=0/65981, sectors=0/527848, merge=0/0, ticks=0/164146, in_queue=164146, util=99.49%
"""


# ----------------------------------------------------------------------------- helpers


def children() -> list[int]:
    """Pids of live (non-zombie) child processes of this process, from /proc."""
    me = os.getpid()
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me and fields[0] != "Z":
            out.append(int(entry.name))
    return out


def finite_positive(x: float) -> bool:
    return math.isfinite(x) and x > 0


def stub_tool(directory: Path, name: str, output: str, exit_code: int = 0) -> str:
    """An executable that prints ``output`` and exits with ``exit_code``."""
    (directory / f"{name}.out").write_text(output)
    script = directory / name
    script.write_text(f'#!/bin/sh\ncat "{directory / name}.out"\nexit {exit_code}\n')
    script.chmod(0o755)
    return str(script)


# ----------------------------------------------------------------------------- CPU


def test_cpu_probe_runs_for_real_and_leaves_no_process() -> None:
    before = set(children())
    res = cpu_probe(0.3, threads=2)
    assert res.problems == ()
    assert finite_positive(res.ops_per_core)
    assert finite_positive(res.ops_per_cpu_s)
    assert res.ops_per_cpu_s >= res.ops_per_core * 0.95  # CPU time never exceeds wall time
    assert math.isfinite(res.cv) and res.cv >= 0
    assert math.isfinite(res.wall_cv) and res.wall_cv >= 0
    assert 0 < res.cpu_share <= 1.05
    assert len(res.worker_rates) == 2
    assert all(finite_positive(r) for r in res.worker_rates)
    assert res.intervals >= 2
    assert set(children()) <= before


def test_cpu_probe_reports_a_crashed_worker() -> None:
    before = set(children())
    res = cpu_probe(0.3, threads=2, _crash_worker=1)
    assert res.worker_rates == ()
    assert len(res.problems) == 1
    assert "worker 1 crashed" in res.problems[0]
    assert "exit code 17" in res.problems[0]
    assert set(children()) <= before


def test_cpu_probe_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="duration_s"):
        cpu_probe(0)
    with pytest.raises(ValueError, match="threads"):
        cpu_probe(0.1, threads=0)


def test_work_unit_is_fixed() -> None:
    assert q._work_unit() == 302  # primes in [3, 2000): 303 primes below 2000 minus 2


# ----------------------------------------------------------------------------- memory


def test_memory_bandwidth_is_positive() -> None:
    gbps = memory_bandwidth(0.05, array_bytes=16 << 20)
    assert finite_positive(gbps)
    assert gbps < 10_000  # sanity: no machine copies 10 TB/s


# ----------------------------------------------------------------------------- cache


def fake_sysfs(root: Path, entries: list[tuple[str, str, str]]) -> Path:
    for i, (level, ctype, size) in enumerate(entries):
        d = root / f"index{i}"
        d.mkdir(parents=True)
        (d / "level").write_text(level + "\n")
        (d / "type").write_text(ctype + "\n")
        (d / "size").write_text(size + "\n")
    return root


def test_cache_levels_from_sysfs_tree(tmp_path: Path) -> None:
    root = fake_sysfs(
        tmp_path / "cache",
        [
            ("1", "Data", "64K"),
            ("1", "Instruction", "64K"),
            ("2", "Unified", "1024K"),
            ("3", "Unified", "32M"),
        ],
    )
    (root / "index4").mkdir()  # incomplete entry: skipped
    levels = read_cache_levels(root)
    assert [c.level for c in levels] == [1, 1, 2, 3]
    llc = last_level_cache(levels)
    assert llc == CacheLevel(3, "Unified", 32 << 20)
    outcome, _ = q._check_cache_sysfs(root)
    (m,) = outcome.measurements
    assert (m.name, m.value, m.unit, m.tool) == ("llc_size", 32768.0, "KiB", "sysfs")
    assert "L2 1 MiB" in m.detail


def test_cache_levels_missing_is_a_note_not_a_problem(tmp_path: Path) -> None:
    outcome, levels = q._check_cache_sysfs(tmp_path / "nothing")
    assert levels == []
    assert outcome.measurements == ()
    assert outcome.problems == ()
    assert "does not describe the caches" in outcome.notes[0]


def test_cache_levels_of_this_machine() -> None:
    root = Path("/sys/devices/system/cpu/cpu0/cache")
    if not root.is_dir():
        pytest.skip("no cache description in sysfs here")
    levels = read_cache_levels(root)
    assert levels and all(c.size_bytes > 0 for c in levels)
    assert last_level_cache(levels) is not None


def test_cache_sweep_runs_for_real_and_is_cheap() -> None:
    t = time.perf_counter()
    points = cache_sweep()
    elapsed = time.perf_counter() - t
    assert elapsed < 3.0
    assert len(points) >= 2
    sizes = [p.working_set_bytes for p in points]
    assert sizes[0] == 32 << 10 and sizes == sorted(sizes)
    assert all(finite_positive(p.ns_per_load) for p in points)


def test_find_knees_needs_a_lasting_jump() -> None:
    def pts(*ns: float) -> list[SweepPoint]:
        return [SweepPoint((32 << 10) << i, v) for i, v in enumerate(ns)]

    assert find_knees(pts(5, 5, 5.2, 5.1)) == []
    spike = pts(5, 5, 9, 5, 5)  # one noisy sample is not a knee
    assert find_knees(spike) == []
    step = pts(5, 5, 5, 8, 8.2, 8.1)
    (knee,) = find_knees(step)
    assert knee[0].working_set_bytes == 128 << 10 and knee[1].working_set_bytes == 256 << 10
    last = pts(5, 5, 5, 9)  # a jump at the end of the sweep counts
    assert len(find_knees(last)) == 1


def test_cache_sweep_check_says_when_no_knee_shows(monkeypatch: pytest.MonkeyPatch) -> None:
    flat = [SweepPoint((32 << 10) << i, 6.0 + 0.1 * (i % 2)) for i in range(12)]
    monkeypatch.setattr(q, "cache_sweep", lambda **_: flat)
    out = q._check_cache_sweep([], 1.0)
    assert [m.name for m in out.measurements] == ["cache_sweep_max_step"]
    assert out.problems == ()
    assert any("no knee visible" in n for n in out.notes)


def test_cache_sweep_check_matches_knee_to_sysfs(monkeypatch: pytest.MonkeyPatch) -> None:
    ns = [6, 6, 6, 6, 6, 6, 9, 9.5, 10, 10, 10, 10]  # jump from 1 MiB to 2 MiB
    curve = [SweepPoint((32 << 10) << i, v) for i, v in enumerate(ns)]
    monkeypatch.setattr(q, "cache_sweep", lambda **_: curve)
    levels = [CacheLevel(1, "Data", 48 << 10), CacheLevel(2, "Unified", 2 << 20)]
    out = q._check_cache_sweep(levels, 1.0)
    knee = next(m for m in out.measurements if m.name == "cache_sweep_knee")
    assert knee.value == 1024.0 and knee.tool == "builtin"
    assert "matches L2 2 MiB" in knee.detail


# ----------------------------------------------------------------------------- storage


def test_storage_probe_runs_for_real_and_cleans_up(tmp_path: Path) -> None:
    out = q._check_storage(tmp_path, 0.4, None)
    assert out.problems == ()
    by_name = {m.name: m for m in out.measurements}
    assert set(by_name) == {
        "storage_randread_iops",
        "storage_randread_latency",
        "storage_fsync_latency",
    }
    for m in out.measurements:
        assert finite_positive(m.value) and m.tool == "builtin"
    detail = by_name["storage_randread_iops"].detail
    assert "O_DIRECT" in detail or "buffered" in detail
    assert list(tmp_path.iterdir()) == []  # temp directory removed


def test_storage_in_missing_workdir_is_a_problem(tmp_path: Path) -> None:
    out = q._check_storage(tmp_path / "does-not-exist", 0.2, None)
    assert out.measurements == ()
    assert "does not exist" in out.problems[0]


def test_storage_in_a_file_is_a_problem(tmp_path: Path) -> None:
    f = tmp_path / "plain-file"
    f.write_text("x")
    out = q._check_storage(f, 0.2, None)
    assert "is not a directory" in out.problems[0]


def test_storage_in_read_only_dir(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(stat.S_IRUSR | stat.S_IXUSR)  # 0o500
    try:
        out = q._check_storage(ro, 0.2, None)
    finally:
        ro.chmod(0o700)
    if os.geteuid() == 0:  # root ignores the mode bits: the probe simply works
        assert out.problems == ()
        assert out.measurements
    else:
        assert out.measurements == ()
        assert "not writable" in out.problems[0]
    assert list(ro.iterdir()) == []


def test_storage_in_unwritable_system_dir() -> None:
    # /sys refuses new files even to root
    if not Path("/sys").is_dir():
        pytest.skip("no /sys")
    out = q._check_storage(Path("/sys"), 0.2, None)
    assert out.measurements == ()
    assert "not writable" in out.problems[0]


# ----------------------------------------------------------------------------- parsers


def test_parse_sysbench_1_0_20() -> None:
    r = parse_sysbench_cpu(SYSBENCH_1_0_20)
    assert r.version == "1.0.20"
    assert r.threads == 4
    assert r.events_per_s == pytest.approx(4128.44)
    assert r.total_events == 41295
    assert r.latency_avg_ms == pytest.approx(0.97)
    assert r.latency_p95_ms == pytest.approx(0.97)
    assert r.fairness_events_avg == pytest.approx(10323.75)
    assert r.fairness_events_stddev == pytest.approx(20.90)
    assert r.fairness_cv == pytest.approx(20.90 / 10323.75)


def test_parse_sysbench_1_1_0() -> None:
    r = parse_sysbench_cpu(SYSBENCH_1_1_0)
    assert r.version == "1.1.0"
    assert r.threads == 8
    assert r.events_per_s == pytest.approx(707.94)
    assert r.total_events == 21246
    assert r.latency_avg_ms == pytest.approx(11.30)
    assert r.latency_p95_ms == pytest.approx(11.24)
    assert r.fairness_cv == pytest.approx(1.79 / 2655.75)


def test_parse_sysbench_rejects_other_text() -> None:
    with pytest.raises(ValueError, match="events per second"):
        parse_sysbench_cpu("FATAL: unknown test 'cpux'\n")


def test_parse_fio_3_20_sums_jobs_per_direction() -> None:
    read = parse_fio_json(FIO_3_20_JSON)
    assert read.version == "3.20"
    assert read.jobs == 2
    assert read.iops == pytest.approx(982.05078)
    assert read.bw_kib_s == pytest.approx(3944)
    assert read.clat_mean_us is None  # gtod_reduce: fio recorded no latencies
    write = parse_fio_json(FIO_3_20_JSON, "write")
    assert write.iops == pytest.approx(390.525218)


def test_parse_fio_3_42_with_text_around_the_json() -> None:
    r = parse_fio_json(FIO_3_42_JSON_NORMAL, "write")
    assert r.version == "3.42-6-g219f"
    assert r.iops == pytest.approx(3201.659668)
    assert r.bw_kib_s == pytest.approx(12809)
    assert r.clat_mean_us == pytest.approx(2486.019027849)
    assert parse_fio_json(FIO_3_42_JSON_NORMAL, "read").iops == 0.0


def test_parse_fio_rejects_errors() -> None:
    with pytest.raises(ValueError, match="no JSON"):
        parse_fio_json("fio: looks like your file system does not support direct=1/buffered=0\n")
    doc = json.loads(FIO_3_20_JSON)
    doc["jobs"][0]["error"] = 22
    with pytest.raises(ValueError, match="error 22"):
        parse_fio_json(json.dumps(doc))
    with pytest.raises(ValueError, match="no jobs"):
        parse_fio_json('{"fio version": "fio-3.33", "jobs": []}')


# ----------------------------------------------------------------------------- tool paths


def test_sysbench_path_with_a_stub(tmp_path: Path) -> None:
    exe = stub_tool(tmp_path, "sysbench", SYSBENCH_1_0_20)
    out = q._check_cpu_sysbench(exe, 1.0, 4)
    assert out.problems == ()
    eps = next(m for m in out.measurements if m.name == "sysbench_cpu_events_per_s")
    assert eps.value == pytest.approx(4128.44) and eps.tool == "sysbench 1.0.20"
    fair = next(m for m in out.measurements if m.name == "sysbench_fairness_cv")
    assert fair.value == pytest.approx(20.90 / 10323.75, abs=1e-4)


def test_sysbench_failure_is_a_problem(tmp_path: Path) -> None:
    exe = stub_tool(tmp_path, "sysbench", "FATAL: something broke\n", exit_code=1)
    out = q._check_cpu_sysbench(exe, 1.0, 2)
    assert out.measurements == ()
    assert "exit 1" in out.problems[0] and "FATAL: something broke" in out.problems[0]


def test_fio_path_with_a_stub(tmp_path: Path) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    exe = stub_tool(bindir, "fio", FIO_3_20_JSON)
    out = q._check_storage(work, 0.4, exe)
    assert out.problems == ()
    iops = next(m for m in out.measurements if m.name == "storage_randread_iops")
    assert iops.value == pytest.approx(982.1) and iops.tool == "fio 3.20"
    assert "direct=1" in iops.detail
    assert any(m.name == "storage_fsync_latency" for m in out.measurements)
    assert list(work.iterdir()) == []


def test_broken_fio_falls_back_to_the_builtin_probe(tmp_path: Path) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    exe = stub_tool(bindir, "fio", "fio: engine psync not loadable\n", exit_code=1)
    out = q._check_storage(work, 0.4, exe)
    assert any("fio failed (exit 1)" in p for p in out.problems)
    iops = next(m for m in out.measurements if m.name == "storage_randread_iops")
    assert iops.tool == "builtin" and finite_positive(iops.value)
    assert any("built-in probe used" in n for n in out.notes)


def test_run_tool_kills_the_process_group_on_timeout() -> None:
    t = time.perf_counter()
    rc, _ = q._run_tool(["sh", "-c", "sleep 30 & sleep 30"], 0.3)
    assert rc == -1
    assert time.perf_counter() - t < 5.0


@pytest.mark.skipif(shutil.which("sysbench") is None, reason="sysbench not installed")
def test_real_sysbench() -> None:
    exe = shutil.which("sysbench")
    assert exe is not None
    out = q._check_cpu_sysbench(exe, 1.0, 1)
    eps = next(m for m in out.measurements if m.name == "sysbench_cpu_events_per_s")
    assert eps.tool.startswith("sysbench ") and finite_positive(eps.value)


@pytest.mark.skipif(shutil.which("fio") is None, reason="fio not installed")
def test_real_fio(tmp_path: Path) -> None:
    exe = shutil.which("fio")
    assert exe is not None
    out = q._check_storage(tmp_path, 1.0, exe)
    iops = next(m for m in out.measurements if m.name == "storage_randread_iops")
    assert finite_positive(iops.value)
    assert iops.tool.startswith("fio ") or any("fio" in n for n in out.notes)
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- the report


def sample_report() -> QualificationReport:
    return QualificationReport(
        measurements=(
            Measurement("cpu_ops_per_core", 2128.6, "ops/s", "builtin", "2 processes"),
            Measurement("storage_randread_iops", 36909.8, "IOPS", "fio 3.33", "randread 4k"),
            Measurement("llc_size", 491520.0, "KiB", "sysfs"),
        ),
        passed=False,
        problems=("cpu: unstable throughput",),
        perf_factor=0.957,
        notes=("sysbench not installed; built-in probes used",),
    )


def test_report_json_round_trip() -> None:
    r = sample_report()
    data = json.loads(json.dumps(r.to_json()))
    assert data["profile"] == {"perf": 0.957, "iops_k": 36.91, "llc_kib": 491520.0}
    assert QualificationReport.from_json(data) == r
    assert r.value("llc_size") == 491520.0 and r.value("nope") is None


def test_report_from_json_rejects_bad_input() -> None:
    data = sample_report().to_json()
    with pytest.raises(ValueError, match="passed"):
        QualificationReport.from_json({**data, "passed": "yes"})
    with pytest.raises(ValueError, match="measurements"):
        QualificationReport.from_json({**data, "measurements": {}})
    bad = {**data, "measurements": [{"name": "x", "value": "1", "unit": "u", "tool": "t"}]}
    with pytest.raises(ValueError, match="value"):
        QualificationReport.from_json(bad)
    with pytest.raises(ValueError, match="perf_factor"):
        QualificationReport.from_json({**data, "perf_factor": 0})
    with pytest.raises(ValueError, match="finite"):
        Measurement("x", math.nan, "u", "builtin")


def test_qualify_without_tools_end_to_end(tmp_path: Path) -> None:
    before = set(children())
    said: list[str] = []
    t = time.perf_counter()
    report = qualify(tmp_path, use_tools=False, progress=said.append)
    elapsed = time.perf_counter() - t
    assert elapsed < 15.0
    names = {m.name for m in report.measurements}
    expected = {
        "cpu_ops_per_core",
        "cpu_ops_per_cpu_second",
        "cpu_stability_cv",
        "mem_copy_bandwidth",
        "cache_sweep_max_step",
        "storage_randread_iops",
        "storage_randread_latency",
        "storage_fsync_latency",
    }
    assert expected <= names
    for m in report.measurements:
        assert math.isfinite(m.value)
        assert m.tool in ("builtin", "sysfs")  # use_tools=False: no sysbench, no fio
    assert finite_positive(report.perf_factor)
    assert report.passed == (not report.problems)
    assert QualificationReport.from_json(json.loads(json.dumps(report.to_json()))) == report
    assert said and said[-1].startswith("done")
    assert list(tmp_path.iterdir()) == []
    assert set(children()) <= before
    text = render_text(report)
    assert "perf_factor" in text and ("PASSED" in text or "FAILED" in text)


def test_qualify_with_missing_workdir_reports_not_raises(tmp_path: Path) -> None:
    report = qualify(tmp_path / "missing", duration_s=0.2, use_tools=False)
    assert not report.passed
    assert any("does not exist" in p for p in report.problems)
    assert report.value("cpu_ops_per_core") is not None  # the other checks still ran
    assert report.value("storage_randread_iops") is None


def test_qualify_rejects_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="duration_s"):
        qualify(tmp_path, duration_s=0)
    with pytest.raises(ValueError, match="threads"):
        qualify(tmp_path, threads=0)
