// Package keyspace builds the Redis keys of sluice primitives and checks the
// names users give them.
//
// Every key of one primitive instance has the form
//
//	PREFIX{NAME}SUFFIX
//
// so all of them hash to the same Redis Cluster slot and one script may touch
// them together. A name may itself contain braces: the tag then ends at the
// first '}' of the name, which is still the same for every key of that
// instance, so the slot rule holds (see Key for names that start with '}'). Suffixes are chosen by the packages so
// that no two (name, suffix) pairs give the same key: each suffix ends in a
// different character and none ends in '}'.
package keyspace

import (
	"errors"
	"fmt"
	"strings"
)

// MaxNameLen is the longest name, in bytes, that Key accepts. Redis would take
// far longer keys, but a lock or limiter name of kilobytes is a bug, and every
// script call carries its keys.
const MaxNameLen = 1024

// Errors returned by Check and Key.
var (
	ErrEmptyName  = errors.New("name is empty")
	ErrLongName   = fmt.Errorf("name is longer than %d bytes", MaxNameLen)
	ErrBadPrefix  = errors.New("prefix must not contain '{' or '}'")
	ErrLongPrefix = fmt.Errorf("prefix is longer than %d bytes", MaxNameLen)
)

// CheckPrefix reports whether prefix can start keys: braces in the prefix
// would move the hash tag away from the name.
func CheckPrefix(prefix string) error {
	if strings.ContainsAny(prefix, "{}") {
		return fmt.Errorf("%w: %q", ErrBadPrefix, prefix)
	}
	if len(prefix) > MaxNameLen {
		return ErrLongPrefix
	}
	return nil
}

// CheckName reports whether name can be used as an instance name. Any bytes
// are allowed (keys are binary safe); empty and over-long names are not.
func CheckName(name string) error {
	switch {
	case name == "":
		return ErrEmptyName
	case len(name) > MaxNameLen:
		return ErrLongName
	}
	return nil
}

// Key returns prefix + "{" + name + "}" + suffix. It does not check its
// arguments; callers check the prefix once and the name per instance.
//
// A name that starts with '}' would make the hash tag empty, and Redis would
// then hash each whole key to its own slot; such names, and names starting
// with the escape byte '~', are written with one more '~' in front, which
// keeps distinct names distinct.
func Key(prefix, name, suffix string) string {
	var b strings.Builder
	b.Grow(len(prefix) + len(name) + len(suffix) + 3)
	b.WriteString(prefix)
	b.WriteByte('{')
	if escaped(name) {
		b.WriteByte('~')
	}
	b.WriteString(name)
	b.WriteByte('}')
	b.WriteString(suffix)
	return b.String()
}

// AppendKey appends Key(prefix, name, suffix) to dst, so that a caller
// building several strings from a key needs no allocation for the key.
func AppendKey(dst []byte, prefix, name, suffix string) []byte {
	dst = append(append(dst, prefix...), '{')
	if escaped(name) {
		dst = append(dst, '~')
	}
	return append(append(append(dst, name...), '}'), suffix...)
}

// NameOf returns the name of key, made by Key(prefix, name, ""): a
// substring of key, so that a holder of many keys need not keep the names
// too.
func NameOf(key, prefix string) string {
	name := key[len(prefix)+1 : len(key)-1]
	if name != "" && name[0] == '~' {
		name = name[1:] // the escape: no name that starts with '~' is written as it is
	}
	return name
}

// escaped reports whether Key writes a '~' before name.
func escaped(name string) bool {
	return name != "" && (name[0] == '}' || name[0] == '~')
}

// Slot returns the Redis Cluster hash slot of key: CRC16 (XMODEM) of the
// hash tag if the key has a non-empty one, else of the whole key, mod 16384.
func Slot(key string) uint16 {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return crc16(key) & 16383
}

// crc16 is CRC-16/XMODEM (polynomial 0x1021, initial value 0), the checksum
// Redis Cluster uses for key slots.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc = crc<<8 ^ crcTable[byte(crc>>8)^s[i]]
	}
	return crc
}

var crcTable = func() (t [256]uint16) {
	for i := range t {
		crc := uint16(i) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
		t[i] = crc
	}
	return t
}()
