# bash completion for modelctl: asks modelctl what may follow.
_modelctl() {
  local cur opts
  COMPREPLY=()
  cur="${COMP_WORDS[COMP_CWORD]}"
  opts=$("${COMP_WORDS[@]:0:$COMP_CWORD}" --generate-bash-completion 2>/dev/null)
  mapfile -t COMPREPLY < <(compgen -W "${opts}" -- "${cur}")
  return 0
}
complete -o default -F _modelctl modelctl
