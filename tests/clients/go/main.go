// Command probe is the official MCP Go SDK client, used as any user would: one session, calls
// back to back for a while, then one JSON line with every call's outcome. The tests run it
// across a rolling deploy of mcp-epoch servers; nothing here knows about mcp-epoch.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

type call struct {
	N        int    `json:"n"`
	OK       bool   `json:"ok"`
	Ms       int64  `json:"ms"`
	Progress int64  `json:"progress"`
	Text     string `json:"text,omitempty"`
	Error    string `json:"error,omitempty"`
}

func main() {
	url := flag.String("url", "", "the MCP endpoint")
	seconds := flag.Float64("seconds", 10, "how long to keep making calls")
	steps := flag.Int("steps", 10, "progress steps per call (0.1 s each)")
	flag.Parse()

	var progress atomic.Int64
	client := mcp.NewClient(&mcp.Implementation{Name: "go-probe", Version: "1"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(context.Context, *mcp.ProgressNotificationClientRequest) {
			progress.Add(1)
		},
	})
	ctx := context.Background()
	transport := &mcp.StreamableClientTransport{Endpoint: *url}
	// The session era (2025-11-25): sessions and Last-Event-ID resumption.
	session, err := client.Connect(ctx, transport, &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	if err != nil {
		fmt.Fprintln(os.Stderr, "connect:", err)
		os.Exit(2)
	}
	var calls []call
	end := time.Now().Add(time.Duration(*seconds * float64(time.Second)))
	for n := 1; time.Now().Before(end); n++ {
		before := progress.Load()
		began := time.Now()
		callCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
		res, err := session.CallTool(callCtx, &mcp.CallToolParams{
			Name:      "work",
			Arguments: map[string]any{"uid": "go", "call": fmt.Sprintf("k%d", n), "steps": *steps, "interval": 0.1},
			Meta:      mcp.Meta{"progressToken": fmt.Sprintf("p%d", n)},
		})
		cancel()
		c := call{N: n, Ms: time.Since(began).Milliseconds(), Progress: progress.Load() - before}
		if err != nil {
			c.Error = err.Error()
		} else if res.IsError {
			c.Error = "tool error"
		} else {
			c.OK = true
			if len(res.Content) > 0 {
				if t, ok := res.Content[0].(*mcp.TextContent); ok {
					c.Text = t.Text
				}
			}
		}
		calls = append(calls, c)
	}
	out, _ := json.Marshal(map[string]any{"session": session.ID(), "calls": calls})
	fmt.Println(string(out))
	_ = session.Close()
}
