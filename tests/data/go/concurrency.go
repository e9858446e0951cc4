package work

import (
	"context"
	"sync"
	"time"
)

// Result carries a value or an error.
type Result struct {
	Value int
	Err   error
}

// Worker squares jobs until the channel closes.
func Worker(jobs <-chan int, results chan<- Result, wg *sync.WaitGroup) {
	defer wg.Done()
	for j := range jobs {
		results <- Result{Value: j * j}
	}
}

// Pool runs n workers over the inputs.
func Pool(inputs []int, n int) []int {
	jobs := make(chan int, len(inputs))
	results := make(chan Result, len(inputs))
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go Worker(jobs, results, &wg)
	}
	for _, x := range inputs {
		jobs <- x
	}
	close(jobs)
	wg.Wait()
	close(results)
	out := []int{}
	for r := range results {
		out = append(out, r.Value)
	}
	return out
}

// WithTimeout waits for a value or gives up.
func WithTimeout(ctx context.Context, ch <-chan string, d time.Duration) (string, bool) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case s, ok := <-ch:
		return s, ok
	case <-timer.C:
		return "", false
	case <-ctx.Done():
		return "", false
	}
}

// Counter is safe for concurrent use.
type Counter struct {
	mu sync.Mutex
	n  map[string]int
}

// Inc increments a key.
func (c *Counter) Inc(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[key]++
}

// Generate yields numbers on a channel.
func Generate(limit int) <-chan int {
	ch := make(chan int)
	go func() {
		defer close(ch)
		for i := 0; i < limit; i++ {
			ch <- i
		}
	}()
	return ch
}

// FirstOf returns the first value sent on any channel.
func FirstOf(chans ...chan int) int {
	done := make(chan struct{})
	out := make(chan int, 1)
	for _, c := range chans {
		go func(c chan int) {
			select {
			case v := <-c:
				out <- v
			case <-done:
			}
		}(c)
	}
	v := <-out
	close(done)
	return v
}
