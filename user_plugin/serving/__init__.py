"""``vaswani-serve``: a trained model behind HTTP, with dynamic batching across clients.

One process serves one model (the hub's fairseq backend, the exact decoder, or a CTranslate2
export) with the same text pipeline, decoding and outputs as ``vaswani-translate``. Requests of
many clients that arrive within a few milliseconds are decoded together by one worker thread;
bounded queue, body size, sentence count and deadline keep every client answered. A page at
``/`` translates and draws the encoder-decoder attention. docs/serving.md is the user's guide.

Modules, one concept each:

* :mod:`.limits`: the bounds of a server (:class:`~.limits.Limits`);
* :mod:`.request_body`: a request's JSON read and checked field by field;
* :mod:`.served_model`: the model loaded through the hub, its fingerprint, translations and
  attention;
* :mod:`.batcher`: the queue and the decoding thread (dynamic batching);
* :mod:`.app`: the Starlette application and its routes;
* :mod:`.server`: uvicorn on a bound socket, stop signals, exit status;
* ``static/``: the page (HTML, a script, a style sheet).

Importing the package imports neither torch nor fairseq; :mod:`.app` and :mod:`.server` need
Starlette and uvicorn.
"""
