"""Remote hosts: SSH (paramiko), Ansible inventories and ansible-runner playbook runs."""
