"""edgesched.fieldtest"""
