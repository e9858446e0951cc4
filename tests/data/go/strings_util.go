// Package textutil holds small string helpers written for the grammar tests.
package textutil

import (
	"sort"
	"strings"
	"unicode"
)

// Reverse returns s with its runes in reverse order.
func Reverse(s string) string {
	r := []rune(s)
	for i, j := 0, len(r)-1; i < j; i, j = i+1, j-1 {
		r[i], r[j] = r[j], r[i]
	}
	return string(r)
}

// IsPalindrome reports whether s reads the same both ways, ignoring case.
func IsPalindrome(s string) bool {
	s = strings.ToLower(s)
	return s == Reverse(s)
}

// WordCount counts the words of text.
func WordCount(text string) map[string]int {
	counts := make(map[string]int)
	for _, w := range strings.Fields(text) {
		counts[strings.Trim(w, ".,;:!?")]++
	}
	return counts
}

// TopWords returns the n most frequent words.
func TopWords(counts map[string]int, n int) []string {
	words := make([]string, 0, len(counts))
	for w := range counts {
		words = append(words, w)
	}
	sort.Slice(words, func(i, j int) bool {
		if counts[words[i]] != counts[words[j]] {
			return counts[words[i]] > counts[words[j]]
		}
		return words[i] < words[j]
	})
	if len(words) > n {
		words = words[:n]
	}
	return words
}

// CamelToSnake converts "fooBar" to "foo_bar".
func CamelToSnake(s string) string {
	var b strings.Builder
	for i, r := range s {
		if unicode.IsUpper(r) {
			if i > 0 {
				b.WriteByte('_')
			}
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}

/* Vowels counts the vowels of s.
   A general comment over several lines. */
func Vowels(s string) (n int) {
	for _, c := range s {
		switch c {
		case 'a', 'e', 'i', 'o', 'u':
			n++
		default:
		}
	}
	return
}

// Escape quotes a string the long way.
func Escape(s string) string {
	const quote = '"'
	out := "\"" + s + "\x22"
	raw := `raw \n string
spanning lines`
	_ = raw
	_ = "\u00e9\U0001F600\101\t"
	return out + string(quote)
}
