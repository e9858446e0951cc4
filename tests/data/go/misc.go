package misc

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
)

// Stack is a LIFO of ints.
type Stack struct{ items []int }

// Push adds an item.
func (s *Stack) Push(v int) { s.items = append(s.items, v) }

// Pop removes the top item.
func (s *Stack) Pop() (int, error) {
	if len(s.items) == 0 {
		return 0, errors.New("empty stack")
	}
	v := s.items[len(s.items)-1]
	s.items = s.items[:len(s.items)-1]
	return v, nil
}

// ReadLines reads all lines of a file.
func ReadLines(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	return lines, sc.Err()
}

// ParseInts converts fields, skipping bad ones.
func ParseInts(fields []string) (out []int) {
	for _, f := range fields {
		n, err := strconv.Atoi(f)
		if err != nil {
			continue
		}
		out = append(out, n)
	}
	return
}

// CopyN copies at most n bytes.
func CopyN(dst io.Writer, src io.Reader, n int64) (written int64, err error) {
	buf := make([]byte, 32*1024)
	for written < n {
		chunk := buf
		if rem := n - written; rem < int64(len(chunk)) {
			chunk = chunk[:rem]
		}
		nr, er := src.Read(chunk)
		if nr > 0 {
			nw, ew := dst.Write(chunk[0:nr])
			written += int64(nw)
			if ew != nil {
				err = ew
				break
			}
		}
		if er == io.EOF {
			break
		} else if er != nil {
			err = er
			break
		}
	}
	return written, err
}

// Matrix multiplies two square matrices.
func Matrix(a, b [][]float64) [][]float64 {
	n := len(a)
	c := make([][]float64, n)
	for i := range c {
		c[i] = make([]float64, n)
	}
outer:
	for i := 0; i < n; i++ {
		for j := 0; j < n; j++ {
			if len(b[j]) != n {
				break outer
			}
			for k := 0; k < n; k++ {
				c[i][k] += a[i][j] * b[j][k]
			}
		}
	}
	return c
}

// Grade maps a score to a letter, falling through.
func Grade(score int) (g string) {
	switch s := score / 10; s {
	case 10:
		fallthrough
	case 9:
		g = "A"
	case 8:
		g = "B"
	default:
		g = "F"
	}
	return g
}

// Index finds v in xs, using goto.
func Index(xs []int, v int) int {
	i := 0
loop:
	if i < len(xs) {
		if xs[i] == v {
			return i
		}
		i++
		goto loop
	}
	return -1
}

// Pointers takes addresses and dereferences.
func Pointers() int {
	x := 1
	p := &x
	*p += 2
	pp := &p
	**pp *= 3
	arr := [...]string{"a", "b", "c"}
	s := arr[1:3:3]
	return x + len(s) + len(arr[:]) + cap(s[1:])
}

// Closures returns a counter function.
func Closures() func() int {
	count := 0
	return func() int {
		count++
		return count
	}
}

// Labels continue an outer loop.
func Labels(grid [][]int) (n int) {
rows:
	for _, row := range grid {
		for _, v := range row {
			if v < 0 {
				continue rows
			}
		}
		n++
	}
	return
}

// Structs use anonymous structs and maps of slices.
func Structs() map[string][]struct{ A, B int } {
	m := map[string][]struct{ A, B int }{
		"x": {{1, 2}, {A: 3, B: 4}},
	}
	var empty struct{}
	_ = empty
	m["y"] = append(m["y"], struct{ A, B int }{5, 6})
	return m
}

func noBody(int) string

func unnamed(int, string, ...float64) (bool, error) { return false, nil }

func init() {
	var x, y = 1, "s"
	var z int = x
	if x, y := y, x; x != "" && y > 0 || z == 0 {
		fmt.Println(x, y)
	}
	for range []int{} {
	}
	for {
		break
	}
	_ = x
}
