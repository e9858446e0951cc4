package shapes

import (
	"fmt"
	m "math"
)

// Shape is anything with an area.
type Shape interface {
	Area() float64
	Perimeter() float64
	fmt.Stringer
}

type (
	// Point is a 2D point.
	Point struct {
		X, Y float64
	}
	Circle struct {
		Center Point `json:"center"`
		Radius float64
	}
	Rect struct {
		Min, Max Point
		*Style
		tags []string "tags"
	}
	Style struct{ Color string }
	Celsius float64
	Alias = Point
)

// Area of a circle.
func (c Circle) Area() float64 { return m.Pi * c.Radius * c.Radius }

// Perimeter of a circle.
func (c Circle) Perimeter() float64 {
	return 2 * m.Pi * c.Radius
}

func (c Circle) String() string {
	return fmt.Sprintf("circle(%v, %.2f)", c.Center, c.Radius)
}

// Scale grows the rectangle in place.
func (r *Rect) Scale(f float64) {
	r.Max.X = r.Min.X + (r.Max.X-r.Min.X)*f
	r.Max.Y = r.Min.Y + (r.Max.Y-r.Min.Y)*f
}

// Describe uses a type switch.
func Describe(s interface{}) string {
	switch v := s.(type) {
	case Circle:
		return "circle " + v.String()
	case *Rect, Rect:
		return "rect"
	case nil:
		return "nil"
	default:
		return fmt.Sprint(v)
	}
}

// Total sums the areas.
func Total(shapes []Shape) (sum float64) {
	for _, s := range shapes {
		if c, ok := s.(Circle); ok && c.Radius == 0 {
			continue
		}
		sum += s.Area()
	}
	return
}

// Corners lists a rectangle's corners.
func Corners(r Rect) [4]Point {
	return [4]Point{
		{r.Min.X, r.Min.Y},
		{X: r.Max.X, Y: r.Min.Y},
		r.Max,
		Point{r.Min.X, r.Max.Y},
	}
}

// Origin compares against a composite literal in a header.
func Origin(p Point) bool {
	if p == (Point{}) {
		return true
	}
	for _, q := range []Point{{0, 0}, {1, 1}} {
		if q == p {
			return true
		}
	}
	return false
}

// ToF converts a temperature.
func (c Celsius) ToF() float64 { return float64(c)*9/5 + 32 }
