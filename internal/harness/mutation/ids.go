package main

import (
	"crypto/sha1"
	"encoding/hex"
	"strconv"
	"strings"
)

// lineKeys names each line of src by its text rather than its number, for
// mutant ids: the trimmed line's SHA-1 (8 hex digits) and, where identical
// lines repeat in the file, "+k" for the k-th repeat. An id built on it
// (file:key:col:operator) survives edits above the line, so that
// equivalent.txt keeps meaning while the file changes elsewhere; a change
// to the line itself makes a new id, to be judged again. keys[i] is line
// i+1's.
func lineKeys(src string) []string {
	lines := strings.Split(src, "\n")
	keys := make([]string, len(lines))
	seen := map[string]int{}
	for i, l := range lines {
		sum := sha1.Sum([]byte(strings.TrimSpace(l)))
		k := hex.EncodeToString(sum[:4])
		if n := seen[k]; n > 0 {
			keys[i] = k + "+" + strconv.Itoa(n)
		} else {
			keys[i] = k
		}
		seen[k]++
	}
	return keys
}

// mutantID is the id of a mutant at line (1-based) and col of a file whose
// lineKeys are keys.
func mutantID(file string, keys []string, line, col int, op string) string {
	key := strconv.Itoa(line)
	if line >= 1 && line <= len(keys) {
		key = keys[line-1]
	}
	return file + ":" + key + ":" + strconv.Itoa(col) + ":" + op
}
