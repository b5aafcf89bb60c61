// Package pgdedupgin runs gin handlers inside pgdedup's idempotency
// middleware, [idempotency.Middleware]. A request with an Idempotency-Key
// runs its handlers once, in a transaction they reach with
// idempotency.Tx(c.Request.Context()). A retry with the same key gets the
// first response replayed.
//
// gin's handlers take a *gin.Context, not an http.Handler, so
// gin.WrapH(mw.Wrap(...)) only fits handlers written for net/http.
// [Middleware] puts the rest of a gin chain inside the middleware instead,
// per route or per group, after authentication.
//
//	api := r.Group("/", authenticate)
//	api.Use(pgdedupgin.Middleware(mw))
//	api.POST("/orders", createOrder) // c.JSON(201, ...) is stored and replayed
//
// The answer's status decides, as for any handler of the middleware. Below
// 400, the handlers' writes commit with the stored answer. A 5xx (or a panic)
// rolls them back, and a retry runs the handlers again. A 4xx follows
// idempotency.Config.ClientErrors. A handler that records an error with
// c.Error and answers nothing is answered 500 (rolled back), where gin alone
// would send an empty 200. Error-rendering middleware must therefore run
// after Middleware in the chain, not before it. What it writes once
// Middleware has returned is neither stored nor sent.
package pgdedupgin
