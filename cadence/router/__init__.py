"""Several engines behind one address: the router (`cadence router`, `cadence serve
--data-parallel-size N`) and its policies, and the prefill/decode split's request flow."""
