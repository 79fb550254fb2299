"""The in-sandbox tool server: stdlib + ptyprocess only, bind-mounted read-only into sandboxes."""
