# The one way the project's shell scripts write a file and judge a folder; sourced by
# examples/comparison/launch.sh and examples/gpu/run.sh. Python's counterpart: fusion_lab/common.py
# (replace_atomically, trust_problem); the rules: docs/safety.md.

# replace_file TARGET [COMMAND [ARG...]]: COMMAND's output (without COMMAND: standard input) into a new file
# made exclusively beside TARGET, renamed over TARGET once complete. A link named TARGET is replaced, never
# followed; a file hard-linked to it keeps its content; a failing COMMAND leaves TARGET as it was.
replace_file() {
    local target=$1 temporary status=0
    shift
    temporary=$(mktemp "$(dirname -- "$target")/.tmp-XXXXXXXXXX") || return
    if (($#)); then "$@" > "$temporary" || status=$?; else cat > "$temporary" || status=$?; fi
    if ((status == 0)); then
        chmod "$(printf '%o' $((0666 & ~$(umask))))" "$temporary" && mv -fT -- "$temporary" "$target" && return
        status=$?
    fi
    rm -f -- "$temporary"
    return "$status"
}

# appendable LOG: LOG may be appended to (a log kept across sessions): missing, or a regular file that is no
# link and has no other hard link
appendable() {
    [[ ! -L "$1" ]] && { [[ ! -e "$1" ]] || [[ -f "$1" && "$(stat -c %h -- "$1")" == 1 ]]; }
}

# remove_links FOLDER NAME...: the NAMEs in FOLDER that are links or files with other hard links, removed (each
# named on stderr); what they lead to stays. A program that then writes them by name (fairseq) makes new files.
# Python's counterpart: remove_links in fusion_lab/common.py.
remove_links() {
    local folder=$1 name
    shift
    for name in "$@"; do
        if [[ -L "$folder/$name" ]] || [[ -f "$folder/$name" && "$(stat -c %h -- "$folder/$name")" != 1 ]]; then
            rm -f -- "$folder/$name" || return
            printf '%s: removed, a link or a file with another hard link (what it led to stays)\n' "$folder/$name" >&2
        fi
    done
}

# untrusted PATH...: the first file or folder under the PATHs that this user would not trust as ssh trusts
# a key file (owned by another user, or writable by group or others; a link is judged by its owner), else
# nothing
untrusted() {
    find -H "$@" \( ! -user "$(id -u)" -o \( ! -type l -perm /022 \) \) -print -quit 2>/dev/null
}

# tee_file TARGET: standard input to standard output, and into TARGET as replace_file writes it
tee_file() {
    { tee /dev/fd/3 | replace_file "$1"; } 3>&1
}

# claim_folder FOLDER STAMP NAME...: FOLDER as a tool's own before anything is written into it, the rule of
# claim_out_dir in fusion_lab/common.py. One that is not the tool's (a trusted regular .written_by
# holding STAMP, in a trusted folder) and holds anything is refused (status 1, its entries on stdout) unless
# FORCE=1; then the NAMEs that are links are removed (a program writing them by name makes new files), the
# folder is made, closed to group and others' writes, and stamped.
claim_folder() {
    local folder=$1 stamp=$2 name
    shift 2
    if [[ -d "$folder" && -n "$(ls -A -- "$folder")" && "${FORCE:-0}" != 1 ]] && ! { trusted "$folder" \
            && [[ -f "$folder/.written_by" && ! -L "$folder/.written_by" ]] && trusted "$folder/.written_by" \
            && [[ "$(cat -- "$folder/.written_by")" == "$stamp" ]]; }; then
        ls -A -- "$folder" | head -8 | tr '\n' ' '
        return 1
    fi
    for name in "$@" .written_by; do [[ ! -L "$folder/$name" ]] || rm -f -- "$folder/$name"; done
    mkdir -p -- "$folder" && chmod go-w -- "$folder" && replace_file "$folder/.written_by" printf '%s\n' "$stamp" \
        && chmod 644 -- "$folder/.written_by"
}

# trusted PATH: PATH itself (a link: what it leads to) is owned by this user and not writable by group or others
trusted() {
    [[ -e "$1" && -z "$(find -H "$1" -maxdepth 0 \( ! -user "$(id -u)" -o -perm /022 \) -print 2>/dev/null)" ]]
}
