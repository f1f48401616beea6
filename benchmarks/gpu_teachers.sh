#!/bin/bash
# Teachers on one GPU for en->de and de->en (or one of them: PAIRS=en-de), trained at once
# (four per direction: the preset's size, two 512-d 6+6-layer models, one 512-d with 4 heads
# and FFN 1,024), chosen on val (each alone, then ensembles of the best 2, 3, 4 at beam 5);
# the chosen ensemble scores every test set and translates the training sources
# (distillation) and task 2's captions of its source language (forward translation, and
# back-translation for the reverse direction) until DEADLINE seconds after the start:
#
#     IN=gpu_in OUT=gpu_out bash benchmarks/gpu_teachers.sh
#
# IN holds data/ (Multi30k's train, val and test files, .de.gz and .en.gz), vocab_S_T/ for
# each direction S->T (a run whose tokenizer every teacher shares: `attnmt train` of the
# preset with train.max_steps=1, its weights deleted), and mono/mono.S.gz (task 2's
# captions absent from task 1's train and val, as recipes/en_de.yaml writes them). OUT
# gets syn/*.tar.gz (the translated pairs, both sides cut to their common length) and
# logs.tar.gz (every log, each run's config.yaml and log.csv). records/studies.md says what
# one H200 gave (GPU teachers). A dry run on a CPU, to check the script in minutes:
# DEV=cpu TEACH_TIMEOUT=1500 TRAIN='--set train.max_steps=2 --set train.validate_every=2'
# VAL=10 TRAIN_LINES=15 MONO_LINES=12 (the first lines of val, train and the captions).
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
G=${IN:-gpu_in} W=${WORK:-/tmp/gpu_teachers} OUT=${OUT:-gpu_out}
D=$G/data L=$OUT/logs
DEV=${DEV:-cuda} TRAIN=${TRAIN:---set train.max_minutes=4.2} DEADLINE=${DEADLINE:-535}
VAL=${VAL:-0} MONO_LINES=${MONO_LINES:-0} TRAIN_LINES=${TRAIN_LINES:-0}
PAIRS=${PAIRS:-en-de de-en}

each_pair() {  # COMMAND...: COMMAND SRC TGT for each direction SRC-TGT of PAIRS
    local pair
    for pair in $PAIRS; do "$@" ${pair%-*} ${pair#*-} || return 1; done
}

inputs_present() {  # SRC TGT
    local need
    for need in $D/train.$1.gz $D/train.$2.gz $D/val.$1.gz $D/val.$2.gz $G/vocab_$1_$2/config.yaml $G/mono/mono.$1.gz; do
        [ -f $need ] || { echo "gpu_teachers.sh: $need not found (IN=$G; the head of this script says what IN holds)" >&2; return 1; }
    done
}

each_pair inputs_present || exit 1
mkdir -p $W/syn $L $OUT/syn
python=${PYTHON:-python3}
A="$python -m attnmt"
DEC="--device $DEV --beam 5 --batch-tokens 16384"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  $python -c "import sys, torch; print(sys.version, torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_name())"
  nproc; } > $L/machine.txt 2>&1
[ $DEV = cuda ] && { $python -m pytest -q -p no:cacheprovider tests/test_cuda.py > $L/test_cuda.log 2>&1 & }

BIG="--set model.d_model=512 --set model.heads=8 --set model.ffn_dim=2048 --set model.encoder_layers=6
     --set model.decoder_layers=6 --set model.dropout=0.3 --set model.norm=pre --set train.lr=0.0007"
MID="--set model.d_model=512 --set model.heads=4 --set model.ffn_dim=1024 --set model.encoder_layers=6
     --set model.decoder_layers=6 --set model.dropout=0.3 --set model.norm=pre --set train.lr=0.0007"

teach() {  # SRC TGT NAME OVERRIDES...
    local s=$1 t=$2 n=$3; shift 3
    timeout ${TEACH_TIMEOUT:-345} $A train configs/multi30k_de_en_transformer.yaml --run $W/${s}_$t/$n \
        --set data.src_lang=$s --set data.tgt_lang=$t --set data.dir=$D \
        --set data.tokenizer_from=$G/vocab_${s}_$t --set train.device=$DEV --set train.threads=2 \
        --set train.batch_tokens=8192 $TRAIN "$@" > $L/train_${s}_${t}_$n.log 2>&1
}

bounded() {  # COMMAND...: run it until the deadline (not at all past it)
    local left=$(( DEADLINE - $(el) ))
    [ $left -gt 5 ] && timeout $left "$@"
}

first_bleu() { awk '/^BLEU/ {print $2; exit}' "$1"; }

first_lines() {  # FILE N: FILE's name, or with N > 0 that of a copy of its first N lines
    [ "$2" = 0 ] && { echo $1; return; }
    local copy=$W/$(basename $1 .gz).$2  # both directions may ask for it at once: written whole, then renamed
    local part=$copy.$BASHPID
    [ -f $copy ] || { zcat -f $1 | head -n $2 > $part && mv $part $copy; }
    echo $copy
}

choose() {  # SRC TGT: val scores of singles and ensembles; writes the chosen runs to chosen.txt
    local s=$1 t=$2 E=$L/${1}_$2 n
    mkdir -p $E
    local src=$(first_lines $D/val.$s.gz $VAL) ref=$(first_lines $D/val.$t.gz $VAL)
    for n in preset big1 big2 mid; do
        [ -f $W/${s}_$t/$n/best.safetensors ] || continue
        $A evaluate $W/${s}_$t/$n $DEC --src $src --ref $ref > $E/val_$n.log 2>&1 &
    done
    wait
    local ranked=$(for f in $E/val_*.log; do [ -f $f ] || continue; b=$(first_bleu $f); [ -n "$b" ] && echo "$b $(basename $f .log)"; done \
                   | sort -rn | awk '{sub("val_", "", $2); print $2}')
    echo $ranked > $E/ranked.txt
    [ -n "$ranked" ] || { echo "gpu_teachers.sh: no $s->$t teacher was scored; see train_${s}_${t}_*.log in $OUT/logs.tar.gz" >&2; return 1; }
    local members=($ranked) k
    for k in 2 3 4; do
        [ ${#members[@]} -ge $k ] || break
        $A evaluate $(for n in "${members[@]:0:k}"; do echo $W/${s}_$t/$n; done) $DEC \
            --src $src --ref $ref > $E/val_top$k.log 2>&1 &
    done
    wait
    { for k in 1 2 3 4; do
          f=$E/val_top$k.log; [ $k = 1 ] && f=$E/val_${members[0]}.log
          [ -f $f ] && b=$(first_bleu $f) && [ -n "$b" ] && echo "$b $k"
      done; } | sort -k1,1rn -k2,2n > $E/choice.txt
    local best=$(head -n 1 $E/choice.txt | awk '{print $2}')
    for n in "${members[@]:0:best}"; do echo $W/${s}_$t/$n; done > $E/chosen.txt
}

translate() {  # SRC TGT: the chosen ensemble on the test sets, the training sources, the captions
    local s=$1 t=$2 E=$L/${1}_$2 n
    local chosen=$(cat $E/chosen.txt)
    bounded $A evaluate $chosen $DEC --test $D/test_2016_flickr $D/test_2017_flickr $D/test_2017_mscoco \
        > $E/test_ensemble.log 2>&1 &
    for n in preset big1 big2 mid; do
        [ -f $W/${s}_$t/$n/best.safetensors ] || continue
        bounded $A evaluate $W/${s}_$t/$n $DEC --test $D/test_2016_flickr $D/test_2017_flickr \
            $D/test_2017_mscoco > $E/test_$n.log 2>&1 &
    done
    bounded $A synthesize $chosen $DEC -i $(first_lines $D/train.$s.gz $TRAIN_LINES) \
        -o $W/syn/${s}_${t}_train > $E/syn_train.log 2>&1
    bounded $A synthesize $chosen $DEC -i $(first_lines $G/mono/mono.$s.gz $MONO_LINES) \
        -o $W/syn/${s}_${t}_mono > $E/syn_mono.log 2>&1
    wait
}

pack() {  # PREFIX SRC TGT: both sides cut to their common length, gzipped into $OUT/syn
    local p=$1 s=$2 t=$3 n
    [ -f $p.$s ] && [ -f $p.$t ] || return 0
    n=$(( $(wc -l < $p.$s) < $(wc -l < $p.$t) ? $(wc -l < $p.$s) : $(wc -l < $p.$t) ))
    head -n $n $p.$s > $p.cut.$s; head -n $n $p.$t > $p.cut.$t
    tar -czf $OUT/syn/$(basename $p).tar.gz -C $(dirname $p) $(basename $p).cut.$s $(basename $p).cut.$t
    echo "$(basename $p): $n pairs" >> $L/synthetic.txt
}

start_teachers() {  # SRC TGT: the four teachers, in the background
    teach $1 $2 preset &
    teach $1 $2 big1 $BIG &
    teach $1 $2 big2 $BIG --set train.seed=2 &
    teach $1 $2 mid $MID &
}

pids=()
start_choosing() {  # SRC TGT: choose, then translate, in the background
    (choose $1 $2 && translate $1 $2) & pids+=($!)
}

pack_pair() {  # SRC TGT
    pack $W/syn/$1_$2_train $1 $2
    pack $W/syn/$1_$2_mono $1 $2
}

each_pair start_teachers
wait
echo "teachers trained at $(el) s" >> $L/timeline.txt
each_pair start_choosing
failed=0
for pid in "${pids[@]}"; do wait $pid || failed=1; done
echo "translated at $(el) s" >> $L/timeline.txt
each_pair pack_pair
for r in $W/*_*/*/; do
    [ -d "$r" ] || continue  # no teacher started: the pattern itself
    d=$L/runs/$(basename $(dirname $r))_$(basename $r); mkdir -p $d; cp $r/config.yaml $r/log.csv $d/ 2>/dev/null
done
tar -czf $OUT/logs.tar.gz -C $OUT logs && rm -rf $L
echo "done at $(el) s"
exit $failed
