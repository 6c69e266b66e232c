# shellcheck shell=bash
# Downloads of the recipes (sourced after common.sh, not run): verified, resumable fetches and
# the members of the WMT archives, for the prepare step and the Multi30k demo.

# download URL DEST [SIZE SHA256]: fetch URL into DEST unless DEST is already complete. A partial
# download (DEST.part) is continued. With SIZE and SHA256 the file is checked against them;
# otherwise it must be non-empty. A file that fails the check is removed.
download() {
  local url=$1 dest=$2 size=${3:-} sha=${4:-}
  if [ -f "$dest" ]; then
    log "already downloaded: $dest"
    return 0
  fi
  mkdir -p "$(dirname "$dest")"
  log "downloading $url"
  if command -v wget >/dev/null 2>&1; then
    wget -q --show-progress -c -O "$dest.part" "$url" || die "download failed: $url"
  elif command -v curl >/dev/null 2>&1; then
    curl -fL --retry 3 -C - -o "$dest.part" "$url" || die "download failed: $url"
  else
    die "neither wget nor curl is installed"
  fi
  [ -s "$dest.part" ] || { rm -f "$dest.part"; die "empty download: $url"; }
  if [ -n "$size" ]; then
    local got_size
    got_size=$(file_size "$dest.part")
    [ "$got_size" = "$size" ] || { rm -f "$dest.part"; die "$url: $got_size bytes, expected $size"; }
  fi
  if [ -n "$sha" ]; then
    local got
    got=$(sha256sum "$dest.part" | cut -d' ' -f1)
    [ "$got" = "$sha" ] || { rm -f "$dest.part"; die "$url: sha256 $got, expected $sha"; }
    log "verified sha256 of $(basename "$dest")"
  fi
  mv "$dest.part" "$dest"
}

# download_md5 URL DEST MD5: as download, checked against an md5 sum.
download_md5() {
  local url=$1 dest=$2 md5=$3 got
  if [ -f "$dest" ]; then
    log "already downloaded: $dest"
  else
    download "$url" "$dest.unverified"
    got=$(md5sum "$dest.unverified" | cut -d' ' -f1)
    [ "$got" = "$md5" ] || { rm -f "$dest.unverified"; die "$url: md5 $got, expected $md5"; }
    mv "$dest.unverified" "$dest"
    log "verified md5 of $(basename "$dest")"
  fi
}

# archive_member ARCHIVE MEMBER: the member's contents on stdout (.tgz, .tar; .gz members are
# decompressed).
archive_member() {
  local archive=$1 member=$2
  case "$member" in
    *.gz) tar -xOf "$archive" "$member" | gunzip -c ;;
    *) tar -xOf "$archive" "$member" ;;
  esac
}

# append_parallel ARCHIVE SRC_MEMBER TGT_MEMBER OUT_SRC OUT_TGT: append one corpus of an
# archive to the training text after checking that its two sides have the same line count.
append_parallel() {
  local archive=$1 src_member=$2 tgt_member=$3 out_src=$4 out_tgt=$5 tmp
  tmp=$(dirname "$out_src")/.corpus
  archive_member "$archive" "$src_member" > "$tmp.src" || die "cannot read $src_member from $archive"
  archive_member "$archive" "$tgt_member" > "$tmp.tgt" || die "cannot read $tgt_member from $archive"
  local n
  n=$("$PREPARE_TEXT" check-lines "$tmp.src" "$tmp.tgt") \
    || die "$archive: $src_member and $tgt_member are not parallel"
  log "$(basename "$archive"): $src_member + $tgt_member: $n pairs"
  cat "$tmp.src" >> "$out_src"
  cat "$tmp.tgt" >> "$out_tgt"
  rm -f "$tmp.src" "$tmp.tgt"
}
