package mathx

import "errors"

// ErrNegative is returned for negative inputs.
var ErrNegative = errors.New("negative input")

const (
	KB = 1 << (10 * (iota + 1))
	MB
	GB
)

const Pi, E = 3.14159, 2.71828

var (
	hexMask   = 0xFF_FF
	octal     = 0o755
	oldOctal  = 0644
	binary    = 0b1010
	bigFloat  = 1_000.5e-3
	hexFloat  = 0x1p-2
	imaginary = 2.5i
	small     float32
)

// Factorial computes n! iteratively.
func Factorial(n int) (int, error) {
	if n < 0 {
		return 0, ErrNegative
	}
	result := 1
	for i := 2; i <= n; i++ {
		result *= i
	}
	return result, nil
}

// Fib returns the n-th Fibonacci number.
func Fib(n int) int {
	a, b := 0, 1
	for ; n > 0; n-- {
		a, b = b, a+b
	}
	return a
}

// GCD is Euclid's algorithm.
func GCD(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// Sum adds any number of ints.
func Sum(xs ...int) (total int) {
	for _, x := range xs {
		total += x
	}
	return total
}

// Map applies f to every element.
func Map[T, U any](xs []T, f func(T) U) []U {
	out := make([]U, len(xs))
	for i, x := range xs {
		out[i] = f(x)
	}
	return out
}

// Number is a constraint for numeric types.
type Number interface {
	~int | ~int64 | ~float64
}

// Max returns the largest element, or the zero value.
func Max[T Number](xs []T) T {
	var m T
	for i, x := range xs {
		if i == 0 || x > m {
			m = x
		}
	}
	return m
}

// IsPrime tests primality by trial division.
func IsPrime(n int) bool {
	if n < 2 {
		return false
	}
	for d := 2; d*d <= n; d++ {
		if n%d == 0 {
			return false
		}
	}
	return true
}

// Bits shows the bit operators.
func Bits(x uint) uint {
	x &^= 1
	x |= 1 << 3
	x ^= x >> 1
	return x&0xF | ^x&1
}

// Clamp keeps v within [lo, hi].
func Clamp(v, lo, hi float64) float64 {
	switch {
	case v < lo:
		return lo
	case v > hi:
		return hi
	}
	return v
}
