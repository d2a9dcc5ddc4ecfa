# bash completion for fasa(1): subcommands, their long options, option values that are a fixed
# set, and file names where a model, profile, text or output file goes.
# Installed as share/bash-completion/completions/fasa by `make install`; or: source fasa.bash

# Models: GGUF, safetensors and .fasa files, and directories (a Hugging Face model is one).
_fasa_models()
{
    compopt -o filenames 2>/dev/null
    COMPREPLY+=( $(compgen -d -- "$1") )
    COMPREPLY+=( $(compgen -f -X '!*.gguf' -- "$1") )
    COMPREPLY+=( $(compgen -f -X '!*.safetensors' -- "$1") )
    COMPREPLY+=( $(compgen -f -X '!*.fasa' -- "$1") )
}

# Calibration profiles (JSON), and directories to find them in.
_fasa_profiles()
{
    compopt -o filenames 2>/dev/null
    COMPREPLY+=( $(compgen -d -- "$1") )
    COMPREPLY+=( $(compgen -f -X '!*.json' -- "$1") )
}

_fasa_files()
{
    compopt -o filenames 2>/dev/null
    COMPREPLY+=( $(compgen -f -- "$1") )
}

# Completes a comma-separated list from a set of words: the part after the last comma.
_fasa_list()
{
    local cur=$1 words=$2 head=
    [[ $cur == *,* ]] && head=${cur%,*},
    compopt -o nospace 2>/dev/null
    COMPREPLY=( $(compgen -P "$head" -W "$words" -- "${cur##*,}") )
}

_fasa()
{
    local cur prev cmd i
    COMPREPLY=()
    cur=${COMP_WORDS[COMP_CWORD]}
    prev=${COMP_WORDS[COMP_CWORD-1]}
    local commands="inspect run calibrate convert bench help"

    # the subcommand: the first word after fasa that is not an option
    cmd=
    for (( i = 1; i < COMP_CWORD; i++ )); do
        if [[ ${COMP_WORDS[i]} != -* ]]; then
            cmd=${COMP_WORDS[i]}
            break
        fi
    done
    if [[ -z $cmd ]]; then
        if [[ $cur == -* ]]; then
            COMPREPLY=( $(compgen -W "--help --version" -- "$cur") )
        else
            COMPREPLY=( $(compgen -W "$commands" -- "$cur") )
        fi
        return 0
    fi

    # --opt=value is completed like "--opt value" (bash splits it at '=' into three words)
    if [[ $prev == = && $COMP_CWORD -ge 2 ]]; then
        prev=${COMP_WORDS[COMP_CWORD-2]}
    elif [[ $cur == --*=* ]]; then
        prev=${cur%%=*}
        cur=${cur#*=}
    fi

    # opts: the command's long options; argopts: the options that take a value
    local opts argopts
    case $cmd in
    run)
        opts="--model --mode --profile --budget --fcs --dense-layers --sinks --recent --group --n-predict --temp
              --top-k --top-p --seed --chat --raw --system --ctx --ignore-eos --threads --ids
              --print-ids --dump-logits --json --device --per-head --order-chunks --kv-cold --kv-type --dense
              --tip --target-mass --exact --rerank --group-rerank --dense-budget --tail --help"
        argopts="-m --model --mode -p --profile --budget --fcs --dense-layers --sinks --recent -n --n-predict --temp --top-k
                 --top-p --seed --system --ctx -t --threads --ids --dump-logits --device --kv-cold --kv-type --dense
                 --tip --target-mass --rerank --group-rerank --dense-budget --tail"
        case $prev in
        -m|--model) _fasa_models "$cur"; return 0 ;;
        --mode) COMPREPLY=( $(compgen -W "full fasa-c fasa-m" -- "$cur") ); return 0 ;;
        --kv-cold) compopt -o filenames 2>/dev/null; COMPREPLY=( $(compgen -d -- "$cur") ); return 0 ;;
        --kv-type) COMPREPLY=( $(compgen -W "f16 f32" -- "$cur") ); return 0 ;;
        --device) COMPREPLY=( $(compgen -W "cpu cuda" -- "$cur") ); return 0 ;;
        --tip) COMPREPLY=( $(compgen -W "q4 group union" -- "$cur") ); return 0 ;;
        --tail) COMPREPLY=( $(compgen -W "on off mean blocks" -- "$cur") ); return 0 ;;
        --budget) COMPREPLY=( $(compgen -W "auto" -- "$cur") ); return 0 ;;
        --dense-budget) COMPREPLY=( $(compgen -W "0 4x" -- "$cur") ); return 0 ;;
        -p|--profile) _fasa_profiles "$cur"; return 0 ;;
        --ids|--dump-logits) _fasa_files "$cur"; return 0 ;;
        --target-mass|--fcs|--dense-layers|--sinks|--recent|--dense|-n|--n-predict|--temp|--top-k|--top-p|--seed|--system|--ctx|-t|--threads)
            return 0 ;;
        esac
        ;;
    calibrate)
        opts="--output --tokens --prefill --k --rank-k --fcs --chunks --threads --json --help"
        argopts="-o --output --tokens --prefill --k --rank-k --fcs --chunks -t --threads"
        case $prev in
        -o|--output) _fasa_profiles "$cur"; return 0 ;;
        --chunks) COMPREPLY=( $(compgen -W "plane adjacent" -- "$cur") ); return 0 ;;
        --tokens|--prefill|--k|--rank-k|--fcs|-t|--threads) return 0 ;;
        esac
        ;;
    inspect)
        opts="--tensors --json --k --fcs --csv --heatmap --marks --compare --export --output --type --devices --help"
        argopts="--k --fcs --csv --heatmap --compare --export -o --output --type"
        case $prev in
        --compare) _fasa_profiles "$cur"; return 0 ;;
        --csv|--heatmap|-o|--output) _fasa_files "$cur"; return 0 ;;
        --export) COMPREPLY=( $(compgen -W "sglang-ds json-dims" -- "$cur") ); return 0 ;;
        --type) COMPREPLY=( $(compgen -W "qk q k" -- "$cur") ); return 0 ;;
        --k|--fcs) return 0 ;;
        esac
        ;;
    convert)
        opts="--profile --output --to --dtype --bundle --zstd --json --help"
        argopts="-p --profile -o --output --to --dtype"
        case $prev in
        -p|--profile) _fasa_profiles "$cur"; return 0 ;;
        -o|--output) _fasa_files "$cur"; return 0 ;;
        --to) COMPREPLY=( $(compgen -W "fasa hf" -- "$cur") ); return 0 ;;
        --dtype) COMPREPLY=( $(compgen -W "f32 f16 bf16" -- "$cur") ); return 0 ;;
        esac
        ;;
    bench)
        opts="--profile --task --policy --budget --k --context --tokens --steps --depths --seeds
              --repeats --fcs --kv-cold --kv-type --bandwidth --per-layer --heads --per-head --fill --csv --json --threads
              --tip --samples --first-sample --windows --tasks --quick --show --progress --ids --rerank --target-mass
              --group-rerank --dense-budget --tail --recent --help"
        argopts="-p --profile --task --policy --budget --k --context --tokens --steps --depths --seeds
                 --repeats --fcs --kv-cold --kv-type --bandwidth --fill --csv -t --threads --tip --samples --tasks --ids --rerank --target-mass
                 --dense-budget --group-rerank --first-sample --windows --tail --recent"
        case $prev in
        -p|--profile) _fasa_profiles "$cur"; return 0 ;;
        --task) COMPREPLY=( $(compgen -W "ca ppl passkey ruler speed" -- "$cur") ); return 0 ;;
        --tail) COMPREPLY=( $(compgen -W "on off mean blocks" -- "$cur") ); return 0 ;;
        --tip) COMPREPLY=( $(compgen -W "q4 group union" -- "$cur") ); return 0 ;;
        --ids) _fasa_files "$cur"; return 0 ;;
        --tasks)
            _fasa_list "$cur" "niah_single_1 niah_single_2 niah_single_3 niah_multikey_1 niah_multikey_2
                               niah_multikey_3 niah_multivalue niah_multiquery vt cwe fwe qa_1 qa_2"
            return 0 ;;
        --samples|--first-sample|--windows) return 0 ;;
        --policy)
            _fasa_list "$cur" "default full fasa fasa-1/8 fasa-1/4 fasa-group fasa-block fasa-nodense fasa-c fasa-m
                               oracle stream snapkv h2o quest random"
            return 0 ;;
        --kv-cold) compopt -o filenames 2>/dev/null; COMPREPLY=( $(compgen -d -- "$cur") ); return 0 ;;
        --kv-type) COMPREPLY=( $(compgen -W "f16 f32" -- "$cur") ); return 0 ;;
        --csv) _fasa_files "$cur"; return 0 ;;
        --budget|--k|--context|--tokens|--steps|--depths|--seeds|--repeats|--fcs|--bandwidth|-t|--threads) return 0 ;;
        esac
        ;;
    help)
        [[ $COMP_CWORD -eq $(( i + 1 )) ]] && COMPREPLY=( $(compgen -W "${commands% help}" -- "$cur") )
        return 0
        ;;
    *)
        return 0
        ;;
    esac

    if [[ $cur == -* ]]; then
        COMPREPLY=( $(compgen -W "$opts" -- "$cur") )
        return 0
    fi
    # operands: which one is this (options and their values do not count)?
    local pos=0 w j
    for (( j = i + 1; j < COMP_CWORD; j++ )); do
        w=${COMP_WORDS[j]}
        if [[ $w == -* ]]; then
            if [[ " "$(echo $argopts)" " == *" $w "* ]]; then
                (( j++ ))
                [[ ${COMP_WORDS[j]} == = ]] && (( j++ ))
            fi
        else
            (( pos++ ))
        fi
    done
    case $cmd:$pos in
    inspect:0) _fasa_models "$cur"; _fasa_profiles "$cur" ;;
    run:0|calibrate:0|convert:0|bench:0) _fasa_models "$cur" ;;
    calibrate:1|bench:*) _fasa_files "$cur" ;;   # the sample; bench's texts
    esac
    # a directory offered twice (models and profiles) once
    if (( ${#COMPREPLY[@]} > 1 )); then
        local IFS=$'\n'
        COMPREPLY=( $(printf '%s\n' "${COMPREPLY[@]}" | sort -u) )
    fi
    return 0
}

complete -F _fasa fasa
