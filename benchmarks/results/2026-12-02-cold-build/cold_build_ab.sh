#!/bin/bash
# usage: cb2.sh NAME COMMIT  -> fresh clone of /work/wt-build at COMMIT, empty caches, timed cold + warm build
set -u
NAME=$1; COMMIT=$2
D=/tmp/cb/runs/$NAME; rm -rf $D; mkdir -p $D/kc $D/oc
git clone -q /work/wt-build $D/src && cd $D/src && git checkout -q $COMMIT
export SPECGEN_CACHE_DIR=$D/kc SPECGEN_OBJECT_CACHE=$D/oc PYTHONPATH=$D/src
for i in 1 2; do
  s=$(date +%s.%N)
  /usr/bin/time -o $D/cpu$i -f "%U %S" python -u -m specgen build specs/ -o dist$i/ --locked 2>&1 | python -u -c "
import sys,time
t0=$s
for l in sys.stdin: sys.stdout.write(f'{time.time()-t0:7.1f} {l}')" > $D/log$i
  e=$(date +%s.%N)
  echo "$NAME.$i total=$(echo "$e - $s" | bc | cut -c1-6) cpu(user sys)=$(cat $D/cpu$i | tail -1) load=$(cut -d' ' -f1 /proc/loadavg) sha=$(sha256sum dist$i/*.whl | cut -c1-16)" >> /tmp/cb/results.txt
done
