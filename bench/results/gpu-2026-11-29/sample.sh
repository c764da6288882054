#!/bin/bash
# sample.sh NAME -- command...: run the command, sampling every thread of it and its children
# (name, utime+stime ticks) every 0.2 s into $OUT/NAME.samples; its stdout's last line to $OUT/NAME.json
name=$1; shift; shift
"$@" > /tmp/$name.out 2> /tmp/$name.err &
P=$!
while kill -0 $P 2>/dev/null; do
  ts=$(date +%s.%N)
  for p in $P $(pgrep -P $P); do
    for t in /proc/$p/task/*; do
      [ -r $t/stat ] && echo "$ts $p $(basename $t) $(tr ' ' '_' < $t/comm) $(awk '{print $14+$15}' $t/stat 2>/dev/null)"
    done
  done
  sleep 0.2
done >> /tmp/s/$name.samples
wait $P
tail -1 /tmp/$name.out > /tmp/s/$name.json
