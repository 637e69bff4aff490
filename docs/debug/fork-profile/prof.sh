#!/bin/bash
B=/ptlab/bin
echo 0 > /proc/sys/kernel/kptr_restrict
echo -1 > /proc/sys/kernel/perf_event_paranoid
for r in 1 2 3; do
$B/prof_fork 4 200 1 8
$B/prof_fork 1024 200 1 8
done
cd /tmp
$B/prof_fork 1024 200 1 12
echo "## fork 1 GiB, shared, 200 forks: the parent's samples under copy_process"
perf report -i /tmp/p.data --stdio --comm prof_fork --no-children --sort sym -g none --percent-limit 0.02 --parent='^copy_process$' -x 2>&1 | grep -v "^$" | grep -v "^# [A-Z(]" | head -60
echo "## children, prof_fork only"
perf report -i /tmp/p.data --stdio --comm prof_fork --children --sort sym -g none --percent-limit 0.3 2>&1 | grep -v "^$" | grep -v "^# [A-Z(]" | head -60
exit 0
