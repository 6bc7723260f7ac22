package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// A luaTok is one token of a Lua script: comments and white space are
// dropped, strings keep their quotes.
type luaTok struct {
	kind       byte // 'n' name or keyword, '#' number, 's' string, 'o' operator
	text       string
	off        int // byte offset of the first character
	line, col  int // 1-based
	lineStarts bool
}

// lexLua splits src into tokens. It knows what the generator must not
// mutate (comments, strings, long brackets), not all of Lua.
func lexLua(src string) ([]luaTok, error) {
	var toks []luaTok
	line, lineOff := 1, 0
	startOfLine := true
	i := 0
	newline := func(at int) { line++; lineOff = at + 1; startOfLine = true }
	longClose := func(j int) (int, bool) { // j at '[' of [[ or [=*[; returns end offset past the close
		k := j + 1
		lvl := 0
		for k < len(src) && src[k] == '=' {
			lvl++
			k++
		}
		if k >= len(src) || src[k] != '[' {
			return 0, false
		}
		closer := "]" + strings.Repeat("=", lvl) + "]"
		e := strings.Index(src[k+1:], closer)
		if e < 0 {
			return len(src), true
		}
		return k + 1 + e + len(closer), true
	}
	for i < len(src) {
		c := src[i]
		switch {
		case c == '\n':
			newline(i)
			i++
			continue
		case c == ' ' || c == '\t' || c == '\r':
			i++
			continue
		case strings.HasPrefix(src[i:], "--"):
			if i+2 < len(src) && src[i+2] == '[' {
				if end, ok := longClose(i + 2); ok {
					for k := i; k < end; k++ {
						if src[k] == '\n' {
							newline(k)
						}
					}
					i = end
					continue
				}
			}
			for i < len(src) && src[i] != '\n' {
				i++
			}
			continue
		}
		t := luaTok{off: i, line: line, col: i - lineOff + 1, lineStarts: startOfLine}
		startOfLine = false
		switch {
		case c == '\'' || c == '"':
			j := i + 1
			for j < len(src) && src[j] != c {
				if src[j] == '\\' {
					j++
				}
				if j < len(src) && src[j] == '\n' {
					return nil, fmt.Errorf("line %d: newline in string", line)
				}
				j++
			}
			t.kind, t.text = 's', src[i:j+1]
			i = j + 1
		case c == '[' && i+1 < len(src) && (src[i+1] == '[' || src[i+1] == '='):
			end, ok := longClose(i)
			if !ok {
				t.kind, t.text = 'o', "["
				i++
				break
			}
			t.kind, t.text = 's', src[i:end]
			for k := i; k < end; k++ {
				if src[k] == '\n' {
					newline(k)
				}
			}
			startOfLine = false
			i = end
		case isLetter(c):
			j := i
			for j < len(src) && (isLetter(src[j]) || isDigit(src[j])) {
				j++
			}
			t.kind, t.text = 'n', src[i:j]
			i = j
		case isDigit(c) || (c == '.' && i+1 < len(src) && isDigit(src[i+1])):
			j := i
			for j < len(src) && (isDigit(src[j]) || isLetter(src[j]) || src[j] == '.' ||
				((src[j] == '-' || src[j] == '+') && (src[j-1] == 'e' || src[j-1] == 'E'))) {
				j++
			}
			t.kind, t.text = '#', src[i:j]
			i = j
		default:
			t.kind = 'o'
			for _, op := range []string{"...", "..", "==", "~=", "<=", ">=", "//", "::", "<<", ">>"} {
				if strings.HasPrefix(src[i:], op) {
					t.text = op
					break
				}
			}
			if t.text == "" {
				t.text = src[i : i+1]
			}
			i += len(t.text)
		}
		toks = append(toks, t)
	}
	return toks, nil
}

func isLetter(c byte) bool { return c == '_' || (c|0x20) >= 'a' && (c|0x20) <= 'z' }
func isDigit(c byte) bool  { return c >= '0' && c <= '9' }

// hashFieldCmds are the hash commands whose third argument (after the
// command and the key) onwards are field names.
var hashFieldCmds = map[string]bool{"HGET": true, "HMGET": true, "HSET": true, "HINCRBY": true,
	"HDEL": true, "HEXISTS": true, "HSETNX": true, "HINCRBYFLOAT": true}

// luaMutants returns every mutant of one script (name relative to the
// repository, e.g. lua/mutex_lock.lua). The operators:
//
//	rel      < <= > >= to their boundary twin (< to <=, ...)
//	eq       == to ~= and back
//	not-rm   a not removed
//	if-not   an if or elseif condition negated
//	logic    and to or and back
//	num+1    an integer operand below 100 of an arithmetic or relational
//	         operator plus one (larger ones are unit conversions)
//	index    an element of a reply read one off (h[1] to h[2])
//	ret      a returned code (return N, return {N, ...}) swapped for
//	         another code the script returns
//	call-rm  a redis.call or redis.pcall statement removed
//	key      KEYS[i] or ARGV[i] to a neighbouring index the script uses
//	field    a hash field name to another field the script uses
func luaMutants(name, src string) ([]*Mutant, error) {
	toks, err := lexLua(src)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	var out []*Mutant
	add := func(t luaTok, op string, start, end int, repl string) {
		out = append(out, &Mutant{Lang: "lua", File: name, Line: t.line, Col: t.col, Op: op,
			Start: start, End: end, Orig: src[start:end], Repl: repl})
	}
	prev := func(i int) luaTok {
		if i > 0 {
			return toks[i-1]
		}
		return luaTok{}
	}
	// Return codes and indexes and fields in use, for swaps.
	codes := map[string]bool{}
	retCode := map[int]bool{} // token index of a return code (its number)
	idx := map[string][]int{"KEYS": nil, "ARGV": nil}
	fields := map[string]bool{}
	fieldTok := map[int]bool{}
	for i, t := range toks {
		if t.kind == 'n' && t.text == "return" && i+1 < len(toks) {
			j := i + 1
			if toks[j].text == "{" && j+1 < len(toks) {
				j++
			}
			neg := toks[j].text == "-" && j+1 < len(toks)
			if neg {
				j++
			}
			last := j+1 == len(toks) && toks[i+1].text != "{" // the script's last statement
			if toks[j].kind == '#' && isInt(toks[j].text) && (last || j+1 < len(toks) && isCodeEnd(toks[j+1], toks[i+1].text == "{")) {
				code := toks[j].text
				if neg {
					code = "-" + code
				}
				codes[code] = true
				retCode[j] = true
			}
		}
		if t.kind == 'n' && (t.text == "KEYS" || t.text == "ARGV") && i+3 < len(toks) && toks[i+1].text == "[" &&
			toks[i+2].kind == '#' && toks[i+3].text == "]" {
			n, _ := strconv.Atoi(toks[i+2].text)
			if !containsInt(idx[t.text], n) {
				idx[t.text] = append(idx[t.text], n)
			}
		}
		if t.kind == 's' && (t.text[0] == '\'' || t.text[0] == '"') && i >= 2 {
			// Inside redis.call('HGET', key, 'f', ...): find the command.
			if cmd, at := enclosingCall(toks, i), argIndex(toks, i); hashFieldCmds[cmd] && at >= 2 &&
				(cmd != "HSET" || at%2 == 0) && (!strings.HasPrefix(cmd, "HINCRBY") && cmd != "HSETNX" || at == 2) {
				fields[t.text[1:len(t.text)-1]] = true
				fieldTok[i] = true
			}
		}
	}
	for _, v := range idx {
		sort.Ints(v)
	}
	fieldList := sortedKeys(fields)
	codeList := sortedKeys(codes)
	for i, t := range toks {
		switch {
		case t.kind == 'o' && (t.text == "<" || t.text == "<=" || t.text == ">" || t.text == ">="):
			twin := map[string]string{"<": "<=", "<=": "<", ">": ">=", ">=": ">"}[t.text]
			add(t, "rel", t.off, t.off+len(t.text), twin)
		case t.kind == 'o' && (t.text == "==" || t.text == "~="):
			add(t, "eq", t.off, t.off+len(t.text), map[string]string{"==": "~=", "~=": "=="}[t.text])
		case t.kind == 'n' && t.text == "not" && i+1 < len(toks):
			add(t, "not-rm", t.off, toks[i+1].off, "")
		case t.kind == 'n' && (t.text == "and" || t.text == "or"):
			add(t, "logic", t.off, t.off+len(t.text), map[string]string{"and": "or", "or": "and"}[t.text])
		case t.kind == 'n' && (t.text == "if" || t.text == "elseif"):
			// The condition runs to the matching then at depth 0.
			depth := 0
			for j := i + 1; j < len(toks); j++ {
				switch toks[j].text {
				case "(", "{", "[":
					depth++
				case ")", "}", "]":
					depth--
				}
				if depth == 0 && toks[j].kind == 'n' && toks[j].text == "then" {
					first, last := toks[i+1], toks[j-1]
					end := last.off + len(last.text)
					add(t, "if-not", first.off, end, "not ("+src[first.off:end]+")")
					break
				}
			}
		case t.kind == '#' && retCode[i]:
			code := t.text
			start := t.off
			if p := prev(i); p.text == "-" {
				code, start = "-"+code, p.off
			}
			to := ""
			for k, c := range codeList {
				if c == code {
					to = codeList[(k+1)%len(codeList)]
				}
			}
			if to == code {
				to = map[bool]string{true: "1", false: "0"}[code == "0"]
			}
			add(t, "ret", start, t.off+len(t.text), to)
		case t.kind == '#' && isInt(t.text):
			p := prev(i)
			if p.text == "[" && i >= 2 && (toks[i-2].text == "KEYS" || toks[i-2].text == "ARGV") {
				n, _ := strconv.Atoi(t.text)
				used := idx[toks[i-2].text]
				to := -1
				for _, u := range used {
					if u == n+1 {
						to = u
					}
				}
				if to < 0 {
					for _, u := range used {
						if u == n-1 {
							to = u
						}
					}
				}
				if to > 0 {
					add(t, "key", t.off, t.off+len(t.text), strconv.Itoa(to))
				}
				continue
			}
			n, _ := strconv.Atoi(t.text)
			next := luaTok{}
			if i+1 < len(toks) {
				next = toks[i+1]
			}
			switch {
			case p.text == "[" && next.text == "]":
				// An element of a reply (h[2], t[1]): the wrong field.
				add(t, "index", t.off, t.off+len(t.text), strconv.Itoa(n+1))
			case n < 100 && (arith[p.text] || arith[next.text]):
				// An operand: one more (a bound one off). Literals of
				// 100 and more are unit conversions, where one in a
				// hundred is not a bug a test could see; other literals
				// are arguments and codes.
				add(t, "num+1", t.off, t.off+len(t.text), strconv.Itoa(n+1))
			}
		case t.kind == 's' && fieldTok[i] && len(fieldList) > 1:
			f := t.text[1 : len(t.text)-1]
			for k, c := range fieldList {
				if c == f {
					q := t.text[:1]
					add(t, "field", t.off, t.off+len(t.text), q+fieldList[(k+1)%len(fieldList)]+q)
				}
			}
		case t.kind == 'n' && t.text == "redis" && t.lineStarts && i+3 < len(toks) && toks[i+1].text == "." &&
			(toks[i+2].text == "call" || toks[i+2].text == "pcall") && toks[i+3].text == "(" &&
			(i == 0 || !isContinuation(prev(i))):
			depth := 0
			for j := i + 3; j < len(toks); j++ {
				switch toks[j].text {
				case "(":
					depth++
				case ")":
					depth--
				}
				if depth == 0 {
					add(t, "call-rm", t.off, toks[j].off+1, "")
					break
				}
			}
		}
	}
	keys := lineKeys(src)
	for _, m := range out {
		m.ID = mutantID(m.File, keys, m.Line, m.Col, m.Op)
	}
	return out, nil
}

// isCodeEnd reports whether t ends a returned code: the end of the
// statement, or the first element of a table.
func isCodeEnd(t luaTok, inTable bool) bool {
	if inTable {
		return t.text == ","
	}
	return t.kind == 'n' && (t.text == "end" || t.text == "else" || t.text == "elseif") || t.lineStarts
}

// isContinuation reports whether a statement starting after t would
// continue t's expression instead.
func isContinuation(t luaTok) bool {
	switch t.text {
	case "=", "(", ",", "{", "..", "+", "-", "*", "/", "%", "^", "==", "~=", "<", "<=", ">", ">=", "and", "or", "not", "return", "local", "in":
		return true
	}
	return false
}

// enclosingCall returns the command name (upper case) of the redis.call
// whose argument list holds toks[i], or "".
func enclosingCall(toks []luaTok, i int) string {
	depth := 0
	for j := i - 1; j >= 2; j-- {
		switch toks[j].text {
		case ")", "}":
			depth++
		case "(", "{":
			if depth > 0 {
				depth--
				continue
			}
			if toks[j].text == "(" && (toks[j-1].text == "call" || toks[j-1].text == "pcall") && toks[j-2].text == "." && j+1 < len(toks) && toks[j+1].kind == 's' {
				return strings.ToUpper(strings.Trim(toks[j+1].text, "'\""))
			}
			return ""
		}
	}
	return ""
}

// argIndex returns the 0-based argument position of toks[i] in the call
// enclosing it (counting commas at its depth).
func argIndex(toks []luaTok, i int) int {
	depth, n := 0, 0
	for j := i - 1; j >= 0; j-- {
		switch toks[j].text {
		case ")", "}", "]":
			depth++
		case "(", "{", "[":
			if depth == 0 {
				return n
			}
			depth--
		case ",":
			if depth == 0 {
				n++
			}
		}
	}
	return n
}

// arith are the operators whose integer operands num+1 changes.
var arith = map[string]bool{"+": true, "-": true, "*": true, "/": true, "<": true, "<=": true,
	">": true, ">=": true, "==": true, "~=": true}

func isInt(s string) bool {
	_, err := strconv.Atoi(s)
	return err == nil
}

func containsInt(s []int, n int) bool {
	for _, v := range s {
		if v == n {
			return true
		}
	}
	return false
}

func sortedKeys(m map[string]bool) []string {
	var s []string
	for k := range m {
		s = append(s, k)
	}
	sort.Strings(s)
	return s
}

// allLuaMutants lists the mutants of every lua/*.lua under root.
func allLuaMutants(root string) ([]*Mutant, error) {
	files, err := filepath.Glob(filepath.Join(root, "lua", "*.lua"))
	if err != nil {
		return nil, err
	}
	var all []*Mutant
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		ms, err := luaMutants("lua/"+filepath.Base(f), string(b))
		if err != nil {
			return nil, err
		}
		all = append(all, ms...)
	}
	return all, nil
}
